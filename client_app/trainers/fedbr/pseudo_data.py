"""FedBR's pseudo-data and losses as pure functions (Guo, Tang & Lin, ICML 2023; seed 003).

Notation of the paper: phi_i the local feature extractor, phi_g the global one received this round,
omega the classifier, P_theta the projection head, D_p the pseudo-data (|D_p| = B), C classes.

- :func:`rsm_pseudo_data`      "Random Sample Mean" pseudo-data over one client's samples, label 1/C * 1.
- :func:`shared_rsm_pseudo_data` one RSM set for all clients, each sample the mean of samples of one randomly
                               drawn client (the authors' code).
- :func:`mixture_pseudo_data`  "Mixture" pseudo-data, paper Eq. (4).
- :func:`proxy_means`          the globally shared proxy set x_p that Mixture mixes with: each x_p the mean of
                               randomly drawn images of a proxy dataset ("the sample mean of a proxy dataset");
                               :func:`fit_shape` brings those images to the run's input shape.
- :func:`proxy_samples`        a generated proxy set instead (seeded noise, our option).
- :func:`contrastive_loss`     L_con, paper Eqs. (5)-(7); :func:`similarities` its two cosines.
- :func:`soft_cross_entropy`   L_cls with a soft target (the pseudo-data term of Eq. (3)).
- :func:`mixup`                the "FedBR + Mixup" option on real data (Zhang et al. 2018).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from flcore.methods.fedbr import GENERATED_PROXIES, PAIRINGS


def uniform_labels(n: int, num_classes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The pseudo-label 1/C * 1 for ``n`` samples, shape (n, C)."""
    return torch.full((n, num_classes), 1.0 / num_classes, device=device)


def rsm_pseudo_data(x_local: torch.Tensor, size: int, subset: int, num_classes: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random Sample Mean pseudo-data (paper, "Construction of the pseudo-data", RSM).

    Sample j is x~_j = (1/m) sum_{i in S_j} x_i with S_j a uniformly random m-subset of the local samples
    (drawn without replacement, m = min(subset, n)); its label is y~_j = 1/C * 1.
    Returns (x~, y~) of shapes (size, *x.shape[1:]) and (size, C).
    """
    n = int(x_local.shape[0])
    if n == 0:
        raise ValueError("RSM pseudo-data needs at least one local sample")
    if size <= 0 or subset <= 0:
        raise ValueError(f"RSM needs size > 0 and subset > 0, got size={size}, subset={subset}")
    m = min(subset, n)
    idx = torch.stack([torch.randperm(n, generator=generator)[:m] for _ in range(size)])
    x = x_local[idx.to(x_local.device)].mean(dim=1)
    return x, uniform_labels(size, num_classes, x_local.device)


def shared_rsm_pseudo_data(client_x: list[torch.Tensor], size: int, subset: int, num_classes: int,
                           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One RSM set for every client, as the authors' code builds it (scripts/train_fed.py
    get_augmentation_mean_data): sample j draws a client c_j uniformly from ``client_x`` (the clients' training
    inputs), then ``subset`` of its samples uniformly WITH replacement, and averages them; label 1/C * 1.
    Per sample the generator draws c_j, then the indices, in that order."""
    if not client_x:
        raise ValueError("a shared RSM set needs the training data of at least one client")
    if size <= 0 or subset <= 0:
        raise ValueError(f"RSM needs size > 0 and subset > 0, got size={size}, subset={subset}")
    empty = [i for i, x in enumerate(client_x) if int(x.shape[0]) == 0]
    if empty:
        raise ValueError(f"a shared RSM set draws from every client; client(s) {empty} have no training samples")
    out = []
    for _ in range(size):
        c = int(torch.randint(len(client_x), (1,), generator=generator))
        idx = torch.randint(int(client_x[c].shape[0]), (subset,), generator=generator)
        out.append(client_x[c][idx.to(client_x[c].device)].mean(dim=0))
    return torch.stack(out), uniform_labels(size, num_classes, client_x[0].device)


def mixture_pseudo_data(x_proxy: torch.Tensor, x_local: torch.Tensor, y_local: torch.Tensor, num_classes: int,
                        k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixture pseudo-data, paper Eq. (4): for each proxy sample x_p,

        x~ = (x_p + sum_{k=1}^{K} x_k) / (K + 1),     y~ = (1/C * 1 + sum_{k=1}^{K} y_k) / (K + 1),

    with x_1..x_K drawn uniformly (with replacement) from the local data and y_k their one-hot labels.
    Every y~ sums to 1. ``y_local`` holds integer labels. Returns (x~, y~), shapes (P, ...) and (P, C).
    """
    n = int(x_local.shape[0])
    if n == 0 and k > 0:
        raise ValueError("Mixture pseudo-data needs at least one local sample")
    if k < 0:
        raise ValueError(f"Mixture needs K >= 0, got {k}")
    p = int(x_proxy.shape[0])
    dev = x_local.device
    x = x_proxy.to(dev).clone()
    q = uniform_labels(p, num_classes, dev)
    if k > 0:
        idx = torch.randint(n, (p, k), generator=generator).to(dev)
        x = x + x_local[idx].sum(dim=1)
        q = q + F.one_hot(y_local[idx], num_classes).to(q.dtype).sum(dim=1)
    return x / (k + 1), q / (k + 1)


def proxy_means(images: torch.Tensor, size: int, mean_size: int, generator: torch.Generator) -> torch.Tensor:
    """The shared proxy set of Mixture from a proxy dataset (paper: "the sample mean of a proxy dataset", i.e.
    RSM applied to "irrelevant and globally shared proxy data"): x_p,j = (1/m) sum_{i in S_j} images_i with S_j
    ``mean_size`` = m indices drawn uniformly WITH replacement (authors' code: scripts/train_fed.py
    get_augmentation_proxy_data, m = 10). Returns (size, *images.shape[1:])."""
    n = int(images.shape[0])
    if n == 0:
        raise ValueError("the proxy dataset has no images")
    if size <= 0 or mean_size <= 0:
        raise ValueError(f"proxy means need size > 0 and mean_size > 0, got size={size}, mean_size={mean_size}")
    idx = torch.randint(n, (size, mean_size), generator=generator)
    return images[idx].mean(dim=1)


def fit_shape(images: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Proxy images (N, C, H, W) at the run's input ``shape`` (C, H', W'): the same channels, resized with area
    averaging when both sides shrink, else bilinear (the authors' CIFAR pairs need none). A vector input shape
    or another channel count cannot take an image proxy: ValueError."""
    if tuple(images.shape[1:]) == tuple(shape):
        return images
    if len(shape) != 3 or images.dim() != 4 or int(images.shape[1]) != int(shape[0]):
        raise ValueError(f"proxy images of shape {tuple(images.shape[1:])} cannot stand in for inputs of shape "
                         f"{tuple(shape)} (an image proxy needs image inputs with the same number of channels)")
    h, w = int(shape[1]), int(shape[2])
    shrink = h <= images.shape[2] and w <= images.shape[3]
    if shrink:
        return F.interpolate(images, size=(h, w), mode="area")
    return F.interpolate(images, size=(h, w), mode="bilinear", align_corners=False)


def proxy_samples(shape: tuple[int, ...], size: int, seed: int, kind: str = "smooth-noise") -> torch.Tensor:
    """A generated proxy set x_p for Mixture (``fedbr.proxy`` = smooth-noise / white-noise, our option; the
    paper's is :func:`proxy_means` of a proxy dataset): ``size`` seeded noise samples of input ``shape``, derived
    from the run seed only, so every client builds the identical set without any transfer:
      - ``white-noise``: i.i.d. N(0, 1) values;
      - ``smooth-noise``: N(0, 1) noise at 1/4 resolution (at least 2 per axis), upsampled (bilinear for (C, H, W), linear for (D,)),
        which gives blob-like images with image-like spatial correlation.
    Each sample is standardised to zero mean and unit variance, the scale of normalised inputs.
    Built on the CPU in float32 so it is bit-identical on every client.
    """
    if kind not in GENERATED_PROXIES:
        raise ValueError(f"unknown generated proxy kind '{kind}'; allowed: {', '.join(GENERATED_PROXIES)}")
    gen = torch.Generator().manual_seed(int(seed))
    if kind == "white-noise":
        z = torch.randn((size, *shape), generator=gen)
    elif len(shape) == 3:
        c, h, w = shape
        low = torch.randn((size, c, max(2, math.ceil(h / 4)), max(2, math.ceil(w / 4))), generator=gen)
        z = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
    elif len(shape) == 1:
        (d,) = shape
        low = torch.randn((size, 1, max(2, math.ceil(d / 4))), generator=gen)
        z = F.interpolate(low, size=d, mode="linear", align_corners=False).reshape(size, d)
    else:
        raise ValueError(f"smooth-noise proxy needs an input shape (C, H, W) or (D,), got {tuple(shape)}")
    flat = z.reshape(size, -1)
    flat = flat - flat.mean(dim=1, keepdim=True)
    std = flat.std(dim=1, correction=0, keepdim=True)
    flat = flat / torch.where(std > 1e-6, std, torch.ones_like(std))  # a constant sample stays 0
    return flat.reshape(size, *shape)


def _pair_cosines(local_pseudo: torch.Tensor, global_pseudo: torch.Tensor, local_real: torch.Tensor,
                  pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(s1, s2) = cosine similarities of f1's and f2's pairs (Eqs. 5-6), of equal shapes: (P,), or (P, b) for
    ``all-pairs`` (s1 repeated along the real samples). ``pairing`` as in :func:`contrastive_loss`."""
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing '{pairing}'; allowed: {', '.join(PAIRINGS)}")
    s1 = F.cosine_similarity(local_pseudo, global_pseudo, dim=1)  # (P,)
    if pairing == "index":
        idx = torch.arange(local_pseudo.shape[0], device=local_real.device) % local_real.shape[0]
        s2 = F.cosine_similarity(local_pseudo, local_real[idx], dim=1)  # (P,)
    elif pairing == "mean":
        s2 = F.cosine_similarity(local_pseudo, local_real.mean(dim=0, keepdim=True), dim=1)
    else:
        s2 = F.cosine_similarity(local_pseudo[:, None, :], local_real[None, :, :], dim=2)  # (P, b)
        s1 = s1[:, None].expand_as(s2)
    return s1, s2


def similarities(local_pseudo: torch.Tensor, global_pseudo: torch.Tensor, local_real: torch.Tensor,
                 pairing: str = "index") -> tuple[float, float]:
    """Mean (s1, s2) over the pairs: how close P(phi_i(x_p)) is to P(phi_g(x_p)) and to P(phi_i(x)). Both near
    1 means the projection maps pseudo and real features to one direction and L_con sits at log 2."""
    s1, s2 = _pair_cosines(local_pseudo, global_pseudo, local_real, pairing)
    return float(s1.mean()), float(s2.mean())


def contrastive_loss(local_pseudo: torch.Tensor, global_pseudo: torch.Tensor, local_real: torch.Tensor,
                     tau1: float, tau2: float, pairing: str = "index") -> torch.Tensor:
    """L_con of paper Eqs. (5)-(7), averaged over the pseudo batch. Inputs are already projected by P_theta:

        a_j = P(phi_i(x_p,j)),  g_j = P(phi_g(x_p,j)),  c = P(phi_i(x)) for the real minibatch,
        f1 = exp(sim(a_j, g_j) / tau1),  f2 = exp(sim(a_j, c_.) / tau2),  L_con = -log(f1 / (f1 + f2)),

    with sim the cosine similarity; computed as softplus(s2/tau2 - s1/tau1) = log(1 + f2/f1) for stability.
    Eq. (2)/(3) take the expectation over x_p ~ D_p and x ~ D_i; ``pairing`` says which real sample(s) a
    pseudo sample meets:
      - ``index``: pseudo sample j with real sample j mod b (b = real batch size) - the authors' code, one
        random pair per pseudo sample (an unbiased estimate of the expectation, since batches are shuffled);
      - ``all-pairs``: every pseudo sample with every real sample, averaged over the P x b pairs (the same
        expectation, estimated with all pairs of the two batches);
      - ``mean``: pseudo sample j with the mean projected real feature of the minibatch (1/b) sum_i c_i.
    """
    if tau1 <= 0 or tau2 <= 0:
        raise ValueError(f"temperatures must be > 0, got tau1={tau1}, tau2={tau2}")
    s1, s2 = _pair_cosines(local_pseudo, global_pseudo, local_real, pairing)
    return F.softplus(s2 / tau2 - s1 / tau1).mean()


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-(1/n) sum_j sum_c q_jc log softmax(logits_j)_c: CE(omega(phi(x_p)), y~_p) of paper Eq. (3)."""
    return -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def mixup(x: torch.Tensor, alpha: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mixup (Zhang et al. 2018) within a batch: x' = lam x + (1 - lam) x[perm], lam ~ Beta(alpha, alpha).

    Returns (x', perm, lam); the loss is lam CE(., y) + (1 - lam) CE(., y[perm]).
    """
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
    return lam * x + (1.0 - lam) * x[perm], perm, lam
