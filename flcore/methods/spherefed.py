"""SphereFed (Dong, Zhang, Li, Kung, 'SphereFed: Hyperspherical Federated Learning', ECCV 2022, arXiv 2207.09413).

What was read, and where: the paper's abstract (ar5iv.labs.arxiv.org/html/2207.09413 and the ECCV page, found
with the search tool; the body of the paper was not reachable there): "constraining learned representations of
data points to be on a unit hypersphere shared by clients ... all clients learn their local representations by
minimizing the loss with respect to a fixed classifier whose weights span the unit hypersphere. After federated
training ..., this classifier is further calibrated with a closed-form solution by minimizing a mean squared loss
... computed efficiently and distributedly without direct access of local data". The FedRANE authors' code, which
builds on SphereFed (repository XeniaLLL/HyperFed_and_FedRANE-master): serverFedRANE.py ``FedRANE.__init__`` (the
classifier: the first C rows of the Q of a d x d Gaussian, no bias, frozen in clientFedRANE.py ``__init__``),
clientFedRANE.py ``feature_extract`` (features ``F.normalize``d: unit L2 norm, no scale), ``__init__``
(``nn.MSELoss()`` "to bypass the scaling issue of CE") and ``ffc_compute`` (each client's V = sum_i z_i z_i^T and
U = sum_i z_i onehot(y_i)^T, "for the Fast Federated Calibration algorithm").

So, here: h = F(x) / ||F(x)|| (unit hypersphere), logits = s W^T h with W (d x C, W^T W = I) fixed and built by
every client from the run seed (models/heads.py), local loss MSE(logits, onehot(y)) (torch's mean over the B x C
entries) or cross-entropy; after the last round each client sends V_k, U_k of its training data under the
final global model and the server sets W* = argmin_W sum_i ||s W^T h_i - y_i||^2 + rho ||W||^2
= (V + rho I)^+ U / s with V = sum_k V_k, U = sum_k U_k (rho = 0: the minimum-norm least-squares solution).
The scale s is 1 in the authors' code (which the FedRANE table's SphereFed row comes from); we found no other
value stated.
"""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

LOSSES = ("mse", "ce")
CALIBRATE_ACTION = "train.calibrate"          # message type of the calibration exchange after the last round
CALIBRATION_RECORD = "sphere-calibration"     # reply ArrayRecord {"v": (d, d) float64, "u": (d, C) float64}


@dataclass(frozen=True)
class SphereFedConfig(Section):
    NAME = "spherefed"
    loss: str = param("mse", "local loss on logits s W^T h: mse (mean squared error to the one-hot label, the "
                             "calibration's objective; clientFedRANE.py __init__: nn.MSELoss 'to bypass the scaling "
                             "issue of CE') or ce (cross-entropy)", choices=LOSSES)
    scale: float = param(1.0, "s in logits = s W^T h, h on the unit hypersphere (1: the authors' code, "
                              "clientFedRANE.py feature_extract normalises without a scale)", gt=0)
    calibrate: bool = param(True, "after the last round, replace W by the closed-form least-squares classifier "
                                  "from the clients' V_k = sum h h^T, U_k = sum h y^T (abstract: 'further calibrated "
                                  "with a closed-form solution by minimizing a mean squared loss')")
    calibration_ridge: float = param(0.0, "rho in (V + rho I)^+ U, a ridge on the calibrated classifier (0: plain "
                                           "least squares, minimum-norm where V is singular)", ge=0)


PAPER = "Dong et al., ECCV 2022 (SphereFed: hyperspherical FL, fixed orthogonal classifier + closed-form calibration)"
METHODS = [MethodDecl("spherefed", PAPER, "strategies.methods.spherefed:SphereFedStrategy",
                      "client_app.trainers.spherefed:SphereTrainer", config=SphereFedConfig,
                      model_hook="models.heads:add_sphere_head",
                      payload=Payload(reply_records=(CALIBRATION_RECORD,), actions=("train", CALIBRATE_ACTION)))]
