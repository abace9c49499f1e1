"""The paper presets (applied by flcore/presets.py). Each value is one the paper states, cited in ``source``;
a value the paper does not state is listed in ``choices`` with the reason we picked it.

Offline presets (``scale='offline'``) are the shrunk settings our result files use on this project's offline
data; paper-scale presets need the torchvision data under ``data-root`` (and, for CIFAR, a GPU to finish in
reasonable time).
"""

from __future__ import annotations

from flcore.presets import Preset

UFO = "Zhang et al., ICCV 2021 (FedUFO), Sec. 4.1"

PRESETS: list[Preset] = [
    Preset(
        "fedufo-mnist-shards", UFO, "MNIST, 100 clients with 2 shards of 300 images, 10% per round",
        "Sec. 4.1: 100 clients, shards of McMahan et al., C = 0.1, E = 10, B = 10, SGD lr 0.01, momentum 0.9, "
        "weight decay 2e-4",
        {"method": "fedufo", "dataset": "mnist", "partition": "shards", "shards-per-client": 2, "model": "convnet",
         "fraction-train": 0.1, "local-epochs": 10, "batch-size": 10, "lr": 0.01, "momentum": 0.9,
         "weight-decay": 2e-4, "fedufo.num-clients": 100, "num-server-rounds": 100},
        choices={"num-server-rounds": "the paper plots accuracy over rounds without a stated total; 100 rounds "
                                      "cover its MNIST curves",
                 "model": "the paper's MNIST CNN is McMahan's 2-conv network, our 'convnet'"},
        num_supernodes=100),
]
