"""Arithmetic of training and evaluation: mixed precision (autocast), the tensor memory format, TF32.

Run-config keys ``precision`` (fp32 | bf16-mixed | fp16-mixed), ``memory-format`` (auto | contiguous |
channels-last) and ``tf32`` select a :class:`Numerics`; :func:`applied` puts one model under it for a block (a
client's whole train or evaluate message, the server's evaluation of the global model):

- **mixed precision** is ``torch.autocast`` over the block: matrix products and convolutions run in bf16 / fp16
  with fp32 accumulation; parameters, gradients, optimizer state and every message stay fp32, so clients of
  different precisions interoperate in one federation. The autocast weight-cast cache is off: the block spans
  many optimizer steps, and a cached bf16 copy of a weight would outlive the step that changed it.
- **what stays fp32**: the cross-entropy of training and evaluation takes fp32 logits (:func:`fp32`); CPU
  autocast itself runs the loss functions (cross-entropy, MSE, KL divergence, BCE: the terms' losses too) and
  linear algebra (inverses, solves) in fp32, while softmax, log-softmax, logsumexp, norms and cosine similarities
  follow their input, i.e. bf16 after a bf16 product (checked on torch 2.14.1; the contrastive terms of MOON,
  FedRANE and VHL are such, and are measured, not assumed, to learn as at fp32: tests/test_known_outputs.py,
  docs/RESULTS.md); the FedRANE relation graph is computed in fp64 (models/fedrane/relation_graph.py), which
  autocast leaves alone; nothing on the server but evaluation is under autocast (aggregation, the Nash solve,
  FedBC's duals: fp32/fp64).
- **fp16-mixed** (CUDA only) scales the loss of the one local loop (client_app/training.py) with a gradient
  scaler (:func:`grad_scaler`); a method whose client runs backward passes of its own outside that loop
  declares it cannot take fp16 (``MethodDecl.precisions``) and the run is refused.
- **channels-last** converts the model's 4-D weights for the block and back to contiguous after (inputs are
  not converted: a channels-last weight makes the convolution run channels-last); ``auto`` takes it under
  mixed precision for a model with a 2-D convolution, where it is faster on CPUs with bf16 instructions and on
  tensor-core GPUs (docs/PERFORMANCE.md), and keeps contiguous at fp32, so fp32 runs are bit-for-bit those
  recorded before these keys existed (tests/known_outputs.json).
- **TF32** (CUDA only) lets fp32 matrix products and convolutions use TF32 tensor cores for the block.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from flcore.common import MEMORY_FORMATS, PRECISIONS

_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


@dataclass(frozen=True)
class Numerics:
    """How a block computes (see the module docstring)."""

    precision: str = "fp32"
    memory_format: str = "auto"
    tf32: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.memory_format not in MEMORY_FORMATS:
            raise ValueError(f"memory-format must be one of {', '.join(MEMORY_FORMATS)}, got {self.memory_format!r}")

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.precision)

    def channels_last(self, model: nn.Module) -> bool:
        """Whether ``model`` runs channels-last under these numerics."""
        if self.memory_format == "contiguous":
            return False
        if self.memory_format == "channels-last":
            return True
        return self.mixed and has_conv2d(model)


FP32 = Numerics()


def numerics_of(cfg) -> Numerics:  # noqa: ANN001 - a RunConfig (flcore imports models, not the reverse)
    """The run config's ``precision``, ``memory-format`` and ``tf32``."""
    return Numerics(cfg.precision, cfg.memory_format, cfg.tf32)
_scaler: contextvars.ContextVar[torch.amp.GradScaler | None] = contextvars.ContextVar("grad_scaler", default=None)


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def check_device(numerics: Numerics, device: torch.device) -> None:
    """Refuse what the device cannot do, naming the key (nothing falls back to another precision)."""
    if numerics.precision == "fp16-mixed" and device.type != "cuda":
        raise ValueError(f"run-config precision = 'fp16-mixed' needs a CUDA device (its gradient scaler guards fp16's "
                         f"narrow range), this one is {device.type}: use 'bf16-mixed' on a CPU")
    if numerics.tf32 and device.type != "cuda":
        raise ValueError(f"run-config tf32 = true needs a CUDA device (TF32 tensor cores), this one is {device.type}")


def set_layout(model: nn.Module, channels_last: bool) -> None:
    """Convert the model's 4-D parameters and buffers in place (same Parameter objects: optimizers and
    references stay valid) to channels-last, or back to contiguous."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.dim() == 4:
                # ``to`` restrides a tensor that is contiguous in both layouts (one input channel: the first conv
                # of a grey-scale net), where ``contiguous`` keeps it: the convolution picks its layout from the
                # strides, and that first layer is as much of the gain as the others (docs/PERFORMANCE.md)
                t.data = t.data.to(memory_format=fmt)


def autocast(numerics: Numerics, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for ``numerics`` on ``device`` (no cast cache), or a null context at fp32."""
    dtype = numerics.autocast_dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@contextlib.contextmanager
def applied(model: nn.Module, numerics: Numerics, device: torch.device) -> Iterator[None]:
    """``model`` computes under ``numerics`` inside the block; its layout is contiguous again after it. At the
    default (fp32, contiguous, no TF32) this does nothing at all."""
    last = numerics.channels_last(model)
    if not (numerics.mixed or numerics.tf32 or last):
        yield
        return
    check_device(numerics, device)
    scaler = grad_scaler(numerics, device)
    token = _scaler.set(scaler)
    if last:
        set_layout(model, True)
    try:
        with _tf32(numerics.tf32), autocast(numerics, device):
            yield
    finally:
        _scaler.reset(token)
        if last:
            set_layout(model, False)


def grad_scaler(numerics: Numerics, device: torch.device) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16-mixed (None otherwise: bf16 has fp32's range and needs none)."""
    if numerics.precision != "fp16-mixed":
        return None
    return torch.amp.GradScaler(device.type)


def current_scaler() -> torch.amp.GradScaler | None:
    """The gradient scaler of the block being run (:func:`applied`), for the local loop; None outside fp16."""
    return _scaler.get()


def fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as fp32 for a loss (a no-op on fp32 tensors: fp32 runs are unchanged)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
