"""Pre-flight: every bad run config is refused before any engine starts, in a message naming the key.

Used by the command line (``noniid-fl run``, before Ray or a Grid exists) and by the ServerApp at its start
(``flwr run .`` refuses before round 1). :func:`check` runs, in order:

1. the declared checks (flcore/config.py, flcore/schema.py): unknown or renamed keys (closest key suggested),
   types, bounds, non-finite floats, unknown method (closest name suggested), dataset/partition pairs;
2. the checks that need the machine or the data's shape: model vs. the dataset's input shape
   (:data:`MIN_IMAGE_SIDE`), ``device = "cuda"`` without a CUDA device, torchvision files missing under
   ``data-root``, a ``resume-from`` without a checkpoint, an out-dir that cannot be written or already holds a
   run, and (when the number of nodes is known) a federation too small for ``min-train-nodes`` or for the
   method (its declaration's ``check_federation`` hook, flcore/registry.py).

Every failure is a :class:`ConfigError` whose message names the key, the bad value and what is allowed.
Nothing here imports torch or Flower (except torch for ``device = "cuda"`` on a machine with a GPU driver).
"""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from data_partitioning.datasets import (TORCHVISION_FILES, dataset_shape, missing_torchvision_files, system_copy,
                                       system_copy_hint)
from flcore.config import MODELS, ConfigError, RunConfig
from flcore.registry import get_method, methods
from server_app.outputs import is_nonempty_dir, resume_dir
from server_app.tensorboard_log import check_available as check_tensorboard

# Smallest image side each backbone of models/networks.py is built for; None = any input (it flattens).
# convnet: two 2x2 max-pools; resnet18: three stride-2 stages; vgg11: five 2x2 max-pools (networks.vgg11
# silently drops a pool when the map is smaller, which is no longer VGG-11). All three need (C, H, W) images.
MIN_IMAGE_SIDE: dict[str, int | None] = {"logistic": None, "mlp": None, "convnet": 4, "resnet18": 8, "vgg11": 32,
                                         "domainbed-cnn": 2}
WHY = {"convnet": "its two 2x2 max-pools", "resnet18": "its three stride-2 stages",
       "vgg11": "its five 2x2 max-pools"}
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd")


def check(values: Mapping[str, Any], num_nodes: int | None = None, clients_here: bool = True) -> RunConfig:
    """The parsed run config of ``values`` (out-dir resolved: RunConfig.with_out_dir), or ConfigError.

    ``clients_here``: the clients train on this machine (the command line), so ``device`` is checked here;
    the ServerApp passes False: in a deployment the SuperLink's host need not have the clients' GPU (each
    client refuses ``device='cuda'`` without CUDA itself, at registration, naming the key)."""
    _check_method_name(values)
    cfg = RunConfig.from_dict(values).with_out_dir()
    check_model(cfg)
    if clients_here:
        check_device(cfg)
    check_dataset_files(cfg)
    check_resume(cfg)
    check_out_dir(cfg)
    check_tensorboard(cfg.tensorboard)  # the optional extra, when tensorboard = true (issue 33)
    if num_nodes is not None:
        check_federation(cfg, num_nodes)
    return cfg


def _check_method_name(values: Mapping[str, Any]) -> None:
    name = values.get("method")
    table = methods()
    if isinstance(name, str) and name not in table:
        close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"run-config key 'method' got {name!r}; {hint}allowed: one of {', '.join(table)} "
                          "(`noniid-fl methods`)")


def fits(model: str, in_shape: tuple[int, ...]) -> bool:
    """Whether backbone ``model`` is built for inputs of shape ``in_shape``."""
    side = MIN_IMAGE_SIDE[model]
    return side is None or (len(in_shape) == 3 and min(in_shape[1:]) >= side)


def check_model(cfg: RunConfig) -> None:
    if cfg.model == "auto":
        return
    in_shape, _ = dataset_shape(cfg.dataset)
    if fits(cfg.model, in_shape):
        return
    shape = "x".join(map(str, in_shape))
    side = MIN_IMAGE_SIDE[cfg.model]
    need = (f"images of at least {side}x{side} ({WHY[cfg.model]})" if len(in_shape) == 3
            else "image inputs (channels x height x width)")
    ok = [m for m in MODELS if m == "auto" or fits(m, in_shape)]
    raise ConfigError(f"run-config key 'model' got {cfg.model!r}, which does not fit dataset '{cfg.dataset}' "
                      f"(inputs {shape}): {cfg.model} needs {need}; allowed here: one of {', '.join(ok)}")


def check_device(cfg: RunConfig) -> None:
    if cfg.device != "cuda":
        return
    if not any(os.path.exists(p) for p in GPU_DRIVER_FILES):
        raise ConfigError("run-config key 'device' got 'cuda', but this machine has no GPU driver (none of "
                          f"{', '.join(GPU_DRIVER_FILES)}); allowed here: auto, cpu")
    import torch  # only on a machine with a driver: is this torch built for it?

    if not torch.cuda.is_available():
        raise ConfigError(f"run-config key 'device' got 'cuda', but torch {torch.__version__} sees no CUDA device "
                          f"(built for CUDA {torch.version.cuda}); allowed here: auto, cpu")


def check_dataset_files(cfg: RunConfig) -> None:
    if cfg.dataset.startswith("hf:"):  # loaded through FederatedDataset: no network, no such dataset or columns
        dataset_shape(cfg.dataset)     # are refused here (data_partitioning/hf.py, a ConfigError naming the key)
        return
    if cfg.dataset not in TORCHVISION_FILES or cfg.download:
        return
    missing = missing_torchvision_files(cfg.dataset, cfg.data_root)
    if missing and system_copy(cfg.dataset) is None:  # fmnist: Debian's package copy is read in place
        root = Path(cfg.data_root).expanduser().absolute()
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        packaged = system_copy_hint(cfg.dataset)
        packaged = f", {packaged}" if packaged else ""
        raise ConfigError(
            f"run-config key 'dataset' got {cfg.dataset!r}, whose files are not under data-root '{root}' (looked "
            f"for {missing[0].absolute()}{more}){packaged}.\nGet them with download=true (torchvision fetches them; "
            f"needs network), or copy torchvision's {cfg.dataset} files there, or set data-root to where they are")


def check_resume(cfg: RunConfig) -> None:
    if not cfg.resume_from:
        return
    path = Path(cfg.resume_from).expanduser()
    ckpt = path if path.suffix == ".pt" else path / "checkpoint.pt"
    if not ckpt.is_file():
        raise ConfigError(f"run-config key 'resume-from' got {cfg.resume_from!r}, but there is no checkpoint at "
                          f"{ckpt.absolute()}; allowed: a run directory holding checkpoint.pt (written after every "
                          "round unless checkpoint=false), or '' to start fresh")


def check_out_dir(cfg: RunConfig) -> None:
    out = Path(cfg.out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"run-config key 'out-dir' got '{out}', which is a file; allowed: a directory")
    resuming_here = bool(cfg.resume_from) and resume_dir(cfg.resume_from).absolute() == out.absolute()
    if is_nonempty_dir(out) and not cfg.overwrite and not resuming_here:
        raise ConfigError(
            f"run-config key 'out-dir' got '{out}', which already holds files of another run; allowed: a new or "
            "empty directory.\nPass --overwrite (overwrite=true) to replace its run files, resume-from to continue "
            "it, or leave out-dir out (runs/<method>-<timestamp>)")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"run-config key 'out-dir' got '{out}', which cannot be created: {ancestor} is a file; "
                          "allowed: a writable directory")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise ConfigError(f"run-config key 'out-dir' got '{out}', which is not writable ({ancestor}: "
                          f"{exc.strerror or exc}); allowed: a writable directory") from None


def check_federation(cfg: RunConfig, num_nodes: int) -> None:
    """Checks that need the number of nodes (known to the command line, not to the declarations)."""
    if num_nodes < 1:
        raise ConfigError(f"--nodes got {num_nodes}; allowed: >= 1")
    if cfg.min_train_nodes > num_nodes:
        raise ConfigError(f"run-config key 'min-train-nodes' got {cfg.min_train_nodes}, but the federation has "
                          f"{num_nodes} node(s): the run would wait round-timeout={cfg.round_timeout:g}s and fail; "
                          f"allowed: <= {num_nodes} (or more --nodes)")
    method_check = get_method(cfg.method).check_federation  # the method's own (e.g. FedUFO's discriminator size)
    if method_check is not None:
        method_check(cfg, num_nodes)
