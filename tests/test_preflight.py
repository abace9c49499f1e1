"""server_app/preflight.py against what it guards: the backbones' real input needs (models/networks.py), the
files torchvision reads, the machine's CUDA, out-dir rules; and the ServerApp refusing before round 1."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import server_app.preflight as pf
from data_partitioning.datasets import TORCHVISION_FILES, dataset_shape, missing_torchvision_files
from flcore.config import DATASETS, MODELS, ConfigError, RunConfig, resolve_run_config
from models.networks import BACKBONES

SHAPES = sorted({dataset_shape(d)[0] for d in DATASETS} | {(3, 16, 16), (1, 4, 4), (1, 3, 3)})


def cfg(tmp_path: Path, **over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"out-dir": str(tmp_path / "out"), **over}))


def downsampling_intact(model: str, shape: tuple[int, ...]) -> bool:
    """Whether backbone ``model`` builds and runs on ``shape`` with every down-sampling layer it is meant to
    have (vgg11: all five max-pools) halving a map of side >= 2."""
    try:
        net, dim = BACKBONES[model](shape)
    except (ValueError, RuntimeError, TypeError):
        return False
    sides: list[int] = []
    down = [m for m in net.modules()
            if isinstance(m, nn.MaxPool2d) or (isinstance(m, nn.Conv2d) and m.stride == (2, 2))]
    for m in down:
        m.register_forward_hook(lambda mod, inp, out: sides.append(min(inp[0].shape[-2:])))
    try:
        out = net(torch.zeros(2, *shape))
    except (ValueError, RuntimeError, TypeError):
        return False
    assert out.shape == (2, dim)
    pools = sum(isinstance(m, nn.MaxPool2d) for m in down)
    return all(s >= 2 for s in sides) and (model != "vgg11" or pools == 5)


@pytest.mark.parametrize("model", [m for m in MODELS if m != "auto"])
def test_min_image_side_is_what_the_backbone_is_built_for(model):
    """The table accepts exactly the shapes on which the backbone builds, runs and keeps all its down-sampling
    (vgg11 silently drops max-pools on smaller maps; resnet18's stride-2 stages stop halving)."""
    for shape in SHAPES:
        assert pf.fits(model, shape) == downsampling_intact(model, shape), (model, shape)


def test_vgg11_on_digits_is_refused_and_auto_always_fits(tmp_path):
    with pytest.raises(ConfigError, match=r"'model' got 'vgg11'.*'digits' \(inputs 1x8x8\).*32x32"):
        pf.check_model(cfg(tmp_path, dataset="digits", model="vgg11"))
    for d in DATASETS:
        part = "natural" if d == "synthetic" else "dirichlet"
        pf.check_model(cfg(tmp_path, dataset=d, partition=part))  # model=auto


def _mnist_family(name: str, root: Path, train: bool):
    import torchvision.datasets as tvd  # 1.8 s to import (torch._dynamo through torchvision.ops): only where used

    ds = object.__new__({"mnist": tvd.MNIST, "fmnist": tvd.FashionMNIST, "emnist-letters": tvd.EMNIST}[name])
    ds.root, ds.train, ds.split = str(root), train, "letters"
    return ds


@pytest.mark.parametrize("name", ["mnist", "fmnist", "emnist-letters"])
def test_listed_files_are_what_torchvision_checks_for(tmp_path, name):
    assert len(missing_torchvision_files(name, str(tmp_path))) == len(TORCHVISION_FILES[name])
    for rel in TORCHVISION_FILES[name]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert missing_torchvision_files(name, str(tmp_path)) == []
    assert all(_mnist_family(name, tmp_path, train)._check_exists() for train in (True, False))
    (tmp_path / TORCHVISION_FILES[name][-1]).unlink()
    assert missing_torchvision_files(name, str(tmp_path)) == [tmp_path / TORCHVISION_FILES[name][-1]]
    assert not all(_mnist_family(name, tmp_path, train)._check_exists() for train in (True, False))


@pytest.mark.parametrize("name, cls", [("cifar10", "CIFAR10"), ("cifar100", "CIFAR100")])
def test_cifar_files_are_torchvisions(name, cls):
    import torchvision.datasets as tvd

    cls = getattr(tvd, cls)
    wanted = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    assert [f"{cls.base_folder}/{f}" for f in wanted] == list(TORCHVISION_FILES[name])


def test_legacy_processed_mnist_counts_as_present(tmp_path):
    (tmp_path / "MNIST" / "processed").mkdir(parents=True)
    for f in ("training.pt", "test.pt"):
        (tmp_path / "MNIST" / "processed" / f).write_bytes(b"")
    assert missing_torchvision_files("mnist", str(tmp_path)) == []


def test_dataset_files_check_names_the_path_and_download_skips_it(tmp_path):
    # mnist: no packaged copy to fall back on (fmnist's Debian copy: tests/test_fmnist_data.py)
    with pytest.raises(ConfigError) as err:
        pf.check_dataset_files(cfg(tmp_path, dataset="mnist", **{"data-root": str(tmp_path / "d")}))
    msg = str(err.value)
    assert "'dataset' got 'mnist'" in msg and str(tmp_path / "d" / "MNIST" / "raw") in msg
    assert "download=true" in msg and len(msg.splitlines()) <= 3
    pf.check_dataset_files(cfg(tmp_path, dataset="mnist", download=True, **{"data-root": str(tmp_path / "d")}))


def test_cuda_check_follows_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(pf, "GPU_DRIVER_FILES", (str(tmp_path / "no-driver"),))
    with pytest.raises(ConfigError, match=r"'device' got 'cuda'.*no GPU driver.*auto, cpu"):
        pf.check_device(cfg(tmp_path, device="cuda"))
    (tmp_path / "driver").write_text("")
    monkeypatch.setattr(pf, "GPU_DRIVER_FILES", (str(tmp_path / "driver"),))  # a driver: torch decides
    if torch.cuda.is_available():
        pf.check_device(cfg(tmp_path, device="cuda"))
    else:
        with pytest.raises(ConfigError, match=re.escape(f"torch {torch.__version__} sees no CUDA device")):
            pf.check_device(cfg(tmp_path, device="cuda"))
    pf.check_device(cfg(tmp_path, device="auto"))


def test_out_dir_rules(tmp_path):
    out = tmp_path / "out"
    pf.check_out_dir(cfg(tmp_path))  # does not exist yet: fine
    out.mkdir()
    (out / "run.log").write_text("the command line's own log")
    pf.check_out_dir(cfg(tmp_path))  # only run.log: fine
    (out / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"'out-dir' got .*already holds files"):
        pf.check_out_dir(cfg(tmp_path))
    pf.check_out_dir(cfg(tmp_path, overwrite=True))
    (out / "checkpoint.pt").write_bytes(b"")
    pf.check_out_dir(cfg(tmp_path, **{"resume-from": str(out)}))  # continuing in place
    with pytest.raises(ConfigError, match="is a file"):
        pf.check_out_dir(cfg(tmp_path, **{"out-dir": str(out / "notes.txt" / "x")}))


def test_check_resolves_the_default_out_dir_and_resume_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = pf.check(resolve_run_config({"method": "moon", "dataset": "digits"}))
    assert Path(got.out_dir).parent == tmp_path / "runs" and Path(got.out_dir).name.startswith("moon-")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "old" / "results.json").write_text("{}")
    got = pf.check(resolve_run_config({"resume-from": "old"}))
    assert got.out_dir == str(tmp_path / "old")
    with pytest.raises(ConfigError, match="'resume-from' got 'nowhere'"):
        pf.check(resolve_run_config({"resume-from": "nowhere"}))


def test_federation_checks(tmp_path):
    pf.check_federation(cfg(tmp_path), 2)
    with pytest.raises(ConfigError, match=r"'min-train-nodes' got 2.*1 node.*<= 1"):
        pf.check_federation(cfg(tmp_path), 1)
    with pytest.raises(ConfigError, match=r"'fedufo.num-clients' got 4.*6 nodes.*>= 6"):
        pf.check_federation(cfg(tmp_path, method="fedufo", **{"fedufo.num-clients": 4}), 6)
    pf.check_federation(cfg(tmp_path, method="fedufo", **{"fedufo.num-clients": 6}), 6)
    pf.check_federation(cfg(tmp_path, method="fedavg", **{"fedufo.num-clients": 4}), 6)  # FedUFO's key, not its run


def test_a_method_declares_its_own_federation_check(tmp_path):
    """The pre-flight calls the declaration's check_federation hook (flcore/registry.py), for a method registered
    from outside the project too; it knows no method by name."""
    from flcore.registry import FEDAVG_STRATEGY, BASE_TRAINER, MethodDecl, register, unregister

    seen = []

    def even_only(run: RunConfig, num_nodes: int) -> None:
        seen.append((run.method, num_nodes))
        if num_nodes % 2:
            raise ConfigError(f"method 'pairs' got {num_nodes} nodes; allowed: an even number")

    register(MethodDecl("pairs", "test", FEDAVG_STRATEGY, BASE_TRAINER, check_federation=even_only))
    try:
        pf.check_federation(cfg(tmp_path, method="pairs"), 4)
        with pytest.raises(ConfigError, match="'pairs' got 5 nodes; allowed: an even number"):
            pf.check(resolve_run_config({"method": "pairs", "out-dir": str(tmp_path / "o")}), num_nodes=5)
        pf.check_federation(cfg(tmp_path), 5)  # fedavg declares no such check
    finally:
        unregister("pairs")
    assert seen == [("pairs", 4), ("pairs", 5)]


def test_server_app_refuses_before_round_1_naming_the_key(tmp_path, caplog):
    """The in-process engine calls the real ServerApp: a config that passes the declarations but not the
    pre-flight (vgg11 on 8x8 digits) is refused there, with one log line, before any client is asked."""
    from engines.local import run_local

    out = tmp_path / "out"
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(ConfigError, match="'model' got 'vgg11'"):
        run_local({"dataset": "digits", "model": "vgg11", "out-dir": str(out)}, 2)
    refused = [r.getMessage() for r in caplog.records if "refused before round 1" in r.getMessage()]
    assert len(refused) == 1 and "'model' got 'vgg11'" in refused[0]
    assert not out.exists()


def test_the_server_app_leaves_the_device_to_the_clients(tmp_path, monkeypatch):
    """A deployment's SuperLink host need not have the clients' GPU: only the command line (clients on this
    machine) refuses device='cuda' up front."""
    monkeypatch.setattr(pf, "GPU_DRIVER_FILES", (str(tmp_path / "no-driver"),))
    values = resolve_run_config({"device": "cuda", "out-dir": str(tmp_path / "out")})
    assert pf.check(values, clients_here=False).device == "cuda"
    with pytest.raises(ConfigError, match="'device' got 'cuda'"):
        pf.check(values)
