"""VHL (Tang, Zhang, Shi, Chu, Li and Han, "Virtual Homogeneity Learning: Defending against Data Heterogeneity in
Federated Learning", ICML 2022; the authors' code wizard1203/VHL): every client trains on its own data *and* on
one shared virtual dataset drawn from pure noise by an untrained generator, and calibrates its features so that
natural samples of class c sit with the virtual samples of class c. The server is FedAvg. A comparison row of
FedBR's tables (seed 003: Tables 1-2, 7; its Table 2 runs VHL with 2,000 and 20,000 virtual samples).

Local objective per minibatch (the authors' ``trainers/normal_trainer.py`` VHL_train_one_epoch and
``loss_fn/losses.py`` proxy_align_loss / SupConLoss, as their run script ``VHL_exp/algorithms/
VHL_alignNoiseContrast.sh`` configures them):
    L = CE(f(x), y) + alpha CE(f(x_v), y_v)
        + w_align SupCon([z; sg(z_v)], [y; y_v]; tau) + w_noise SupCon(z_v, y_v; tau)
with (x_v, y_v) a batch of the virtual set, z = the representation the classifier reads, sg the stop-gradient
(``VHL_feat_detach=True``), SupCon the supervised contrastive loss of L2-normalised features (Khosla et al. 2020;
``base_temperature = tau``, so no extra factor).

The virtual set: V classes (V = the task's C here), ``per-class`` samples each; class v's generator inputs are
z ~ N(m_v, 0.3^2 I), m_v ~ N(0, 0.3^2 I) (``data_preprocessing/generative/generate.py``: style_gan_sample_z_mean
0.3, style_gan_sample_z_std 0.3; ``generate.sh``: --sample 200 --noise_num 10, i.e. 2,000 samples).

Sharing: the authors' server sends the generated dataset (``VHL_dataset_from_server=True``). Here every node
*builds it deterministically from the run seed* (the generator is untrained, so the set carries no client data
and no trained value): no bytes travel and nothing about any client is revealed. Relayed instead, it would cost
V * per-class * prod(input shape) * 4 bytes once per client (docs/methods/data-sharing.md gives the numbers).

Our choices (docs/methods/data-sharing.md): (1) the untrained StyleGAN-v2 is replaced by a seeded untrained
two-layer tanh network (no StyleGAN here; what the mechanism needs is data-free virtual classes that are
separable, which the per-class input means give); its outputs lie in [-1, 1] like the datasets' normalised
pixels. (2) The virtual classes share the natural label space (virtual class v is labelled v, the code's
``VHL_label_style='patch'``) where the run script gives them C extra outputs (``'extra'``, model/build.py adds
VHL_num outputs): our classifier has C outputs and is evaluated by their argmax.
"""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl
from flcore.schema import Section, param

NOISE_MEAN_STD = 0.3    # std of each virtual class's mean input m_v (generate.py style_gan_sample_z_mean)
NOISE_STD = 0.3         # std of a virtual sample's input around m_v (generate.py style_gan_sample_z_std)
LATENT_DIM = 64         # generator input width (VHL_alignNoiseContrast.sh style_gan_style_dim=64)
SEED_OFFSET = 7_919     # the virtual set's seed is the run seed plus this (never a client's data seed)


@dataclass(frozen=True)
class VHLConfig(Section):
    NAME = "vhl"
    alpha: float = param(1.0, "weight of the virtual data's cross-entropy (authors' code normal_trainer.py: "
                              "loss_origin + VHL_alpha * loss_aux; VHL_alignNoiseContrast.sh VHL_alpha=1.0)", ge=0)
    align_weight: float = param(1.0, "weight of the class-matched SupCon of natural and (detached) virtual features "
                                     "(VHL_feat_align_inter_cls_weight=1.0)", ge=0)
    noise_weight: float = param(0.1, "weight of the SupCon among the virtual features (VHL_noise_supcon_weight=0.1)",
                                ge=0)
    temperature: float = param(0.07, "SupCon temperature tau (losses.py proxy_align_loss: temperature 0.07, "
                                     "base_temperature 0.07)", gt=0)
    per_class: int = param(200, "virtual samples per class (generate.sh --sample 200 with --noise_num 10: 2,000, "
                                "FedBR Table 2's smaller VHL)", gt=0)
    batch_size: int = param(128, "virtual samples per local step (configs/default.py VHL_dataset_batch_size)", gt=0)


METHODS = [MethodDecl("vhl", "Tang, Zhang, Shi, Chu, Li and Han, ICML 2022 (Virtual Homogeneity Learning)",
                      FEDAVG_STRATEGY, "client_app.trainers.vhl:VHLTrainer", config=VHLConfig)]
