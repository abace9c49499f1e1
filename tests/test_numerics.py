"""Mixed precision, memory format and TF32 (models/numerics.py): what each key does to a model and to the local loop,
the fp32 default untouched, fp16's gradient scaler, and the refusals that name the key."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from client_app.training import LossTerm, OptimConfig, Step, local_train
from flcore.config import ConfigError, RunConfig
from models.networks import convnet, mlp
from models.numerics import FP32, Numerics, applied, autocast, current_scaler, fp32, has_conv2d, set_layout

CPU = torch.device("cpu")
BF16 = Numerics("bf16-mixed")


class Net(nn.Module):
    def __init__(self, body: nn.Module, dim: int) -> None:
        super().__init__()
        self.body, self.head = body, nn.Linear(dim, 10)

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.body(x)
        return self.head(z), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)[0]


def conv_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net(*convnet((1, 12, 12), embed=16))


def data(n: int = 96, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 12, 12, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, :6].mean(dim=(1, 2)) > 0).long()
    return x, y


CFG = OptimConfig(lr=0.05, epochs=2, batch_size=16, momentum=0.9)


def train(model: nn.Module, numerics: Numerics = FP32, terms=()) -> float:
    x, y = data()
    with applied(model, numerics, CPU):
        stats = local_train(model, x, y, CFG, terms, generator=torch.Generator().manual_seed(5))
    return stats.mean_loss


def test_auto_memory_format_is_channels_last_only_under_mixed_precision_with_a_convolution():
    torch.manual_seed(0)
    dense = Net(*mlp((1, 12, 12), hidden=8))
    assert has_conv2d(conv_net()) and not has_conv2d(dense)
    assert BF16.channels_last(conv_net()) and not BF16.channels_last(dense)
    assert not FP32.channels_last(conv_net())                       # fp32 runs keep their layout (and numbers)
    assert Numerics("fp32", "channels-last").channels_last(dense)   # asked for explicitly
    assert not Numerics("bf16-mixed", "contiguous").channels_last(conv_net())
    with pytest.raises(ValueError, match="precision must be one of"):
        Numerics("fp8")
    with pytest.raises(ValueError, match="memory-format must be one of"):
        Numerics("fp32", "nhwc")


def test_the_block_converts_the_weights_in_place_and_restores_them_exactly():
    model = conv_net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    with applied(model, BF16, CPU):
        w = model.body[0][3].weight  # 32 -> 64 channels (the first conv has one input channel: both layouts)
        assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert model(torch.randn(2, 1, 12, 12)).dtype == torch.bfloat16     # the head's matmul ran in bf16
    assert not torch.is_autocast_enabled("cpu")
    assert all(p.is_contiguous() for p in model.parameters())
    assert all(a is b for a, b in zip(params, model.parameters()))        # same Parameter objects: optimizers hold
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.dtype == torch.float32 for p in model.parameters())      # parameters stay fp32


def test_fp32_default_is_a_no_op_bit_for_bit():
    a, b = conv_net(), conv_net()
    loss_a = train(a)                      # under applied(FP32)
    x, y = data()
    loss_b = local_train(b, x, y, CFG, generator=torch.Generator().manual_seed(5)).mean_loss
    assert loss_a == loss_b
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_one_block_over_many_steps_sees_every_update_as_autocast_per_step_does():
    """The block spans every optimizer step, so its cast cache is off: a cached bf16 copy of a weight would
    outlive the step that changed it. It must equal the textbook recipe, autocast around each step's forward."""
    a, b = conv_net(), conv_net()
    train(a, Numerics("bf16-mixed", "contiguous"))
    x, y = data()
    opt = torch.optim.SGD(b.parameters(), lr=CFG.lr, momentum=CFG.momentum)
    gen = torch.Generator().manual_seed(5)
    for _ in range(CFG.epochs):
        order = torch.randperm(x.shape[0], generator=gen)
        for s in range(0, x.shape[0], CFG.batch_size):
            idx = order[s:s + CFG.batch_size]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(b(x[idx]).float(), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_bf16_training_follows_fp32_training():
    a, b, c = conv_net(), conv_net(), conv_net()
    start = torch.cat([p.detach().flatten() for p in a.parameters()])
    loss32 = train(a)
    loss16 = train(b, BF16)                                   # channels-last too (auto)
    loss_nchw = train(c, Numerics("bf16-mixed", "contiguous"))
    w32, w16, wc = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (a, b, c))
    moved = float((w32 - start).norm())
    assert moved > 0.1
    assert float((w16 - w32).norm()) < 0.1 * moved            # bf16's rounding: a few % of the distance travelled
    assert float((wc - w16).norm()) < 0.1 * moved             # the layout changes only the summation order
    assert loss16 == pytest.approx(loss32, rel=0.05) and loss_nchw == pytest.approx(loss32, rel=0.05)


def test_the_criterion_and_evaluation_take_fp32_logits():
    seen = []

    def criterion(logits, y):
        seen.append(logits.dtype)
        return F.cross_entropy(logits, y)

    model, (x, y) = conv_net(), data()
    with applied(model, BF16, CPU):
        local_train(model, x, y, OptimConfig(lr=0.01, epochs=1, batch_size=32), criterion=criterion)
    assert seen == [torch.float32] * 3
    assert fp32(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    t = torch.ones(2)
    assert fp32(t) is t


class _Record(LossTerm):
    """Records the gradients the terms see and the parameters after each step; at step 0 a loss whose gradients
    overflow fp16 (1e30 times the logits)."""

    def __init__(self, inf_at_first: bool) -> None:
        self.inf_at_first, self.grads, self.after = inf_at_first, [], []

    def loss(self, model: nn.Module, step: Step):
        if self.inf_at_first and step.index == 0:
            return step.logits.float().sum() * 1e30
        return None

    def on_gradients(self, model: nn.Module) -> None:
        self.grads.append([p.grad.clone() for p in model.parameters()])

    def after_step(self, model: nn.Module, step: Step) -> None:
        self.after.append([p.detach().clone() for p in model.parameters()])


def _fp16_loop(model: nn.Module, scaler, term: LossTerm) -> None:
    x, y = data(32)
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):  # CPU autocast takes fp16 (a test only)
        local_train(model, x, y, OptimConfig(lr=0.05, epochs=1, batch_size=16), [term], scaler=scaler,
                    generator=torch.Generator().manual_seed(2))


def test_fp16_scaler_unscales_before_the_terms_and_skips_an_overflowed_step():
    plain, scaled = conv_net(), conv_net()
    start = [p.detach().clone() for p in scaled.parameters()]
    ref, rec = _Record(False), _Record(False)
    _fp16_loop(plain, None, ref)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    _fp16_loop(scaled, scaler, rec)
    for g_ref, g in zip(ref.grads[0], rec.grads[0]):          # the terms see true gradients, not 4096x them
        assert torch.allclose(g, g_ref, rtol=0.05, atol=1e-3)
    boom = _Record(True)
    model = conv_net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    _fp16_loop(model, scaler, boom)
    assert all(torch.equal(p, q) for p, q in zip(boom.after[0], start))   # the overflowed step was skipped
    assert scaler.get_scale() == 2.0 ** 11                                  # and the scale backed off
    assert not all(torch.equal(p, q) for p, q in zip(boom.after[1], start))  # the next step trained
    assert current_scaler() is None                                          # outside a fp16 block: none


def test_fp16_and_tf32_need_cuda():
    model = conv_net()
    with pytest.raises(ValueError, match="fp16-mixed' needs a CUDA device"):
        with applied(model, Numerics("fp16-mixed"), CPU):
            pass
    with pytest.raises(ValueError, match="tf32 = true needs a CUDA device"):
        with applied(model, Numerics("fp32", tf32=True), CPU):
            pass
    assert all(p.is_contiguous() for p in model.parameters())


def test_set_layout_keeps_values_and_objects():
    model = copy.deepcopy(conv_net())
    w = model.body[0][3].weight  # 32 -> 64 channels (the first conv has one input channel: both layouts)
    ref = w.detach().clone()
    set_layout(model, True)
    assert model.body[0][3].weight is w and torch.equal(w, ref) and w.is_contiguous(memory_format=torch.channels_last)
    first = model.body[0][0].weight                       # (32, 1, 5, 5): contiguous in both layouts
    assert first.stride() == (25, 1, 5, 1)                 # restrided all the same: the conv runs channels-last
    set_layout(model, False)
    assert w.is_contiguous() and torch.equal(w, ref)
    assert first.stride() == (25, 25, 5, 1)
    assert autocast(FP32, CPU).__class__.__name__ == "nullcontext"


def test_run_config_refusals_name_the_key():
    with pytest.raises(ConfigError, match="run-config key 'precision'"):
        RunConfig.from_dict({"precision": "fp8"})
    with pytest.raises(ConfigError, match="precision = 'fp16-mixed' needs CUDA, but device = 'cpu'"):
        RunConfig.from_dict({"precision": "fp16-mixed", "device": "cpu"})
    with pytest.raises(ConfigError, match="tf32 = true needs CUDA"):
        RunConfig.from_dict({"tf32": True, "device": "cpu"})
    with pytest.raises(ConfigError, match="run-config: method 'scaffold' does not take precision = 'fp16-mixed'"):
        RunConfig.from_dict({"method": "scaffold", "precision": "fp16-mixed"})
    with pytest.raises(ConfigError, match="run-config key 'memory-format'"):
        RunConfig.from_dict({"memory-format": "nhwc"})
    cfg = RunConfig.from_dict({"method": "fedrane", "precision": "bf16-mixed"})
    assert (cfg.precision, cfg.memory_format, cfg.tf32) == ("bf16-mixed", "auto", False)
    assert RunConfig.from_dict({"method": "fedavg", "precision": "fp16-mixed"}).precision == "fp16-mixed"  # on a GPU


def test_every_method_takes_bf16_and_the_fp16_refusals_say_why():
    from flcore.registry import methods

    for name, decl in methods().items():
        assert "bf16-mixed" in decl.precisions, name
        if "fp16-mixed" not in decl.precisions:
            assert "backward passes outside the one local loop" in decl.precision_reason, name


def _federation(node_precisions: dict[int, str], tmp_path, name: str):
    """FedAvg on digits (4 nodes, 2 rounds); ``node_precisions``: node index -> its operator's precision."""
    import numpy as np

    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    grid = FakeGrid(4)
    for i, precision in node_precisions.items():
        grid.contexts[grid.node_ids[i]].node_config["precision"] = precision
    replies = []
    deliver = grid._deliver

    def spy(msg):
        reply = deliver(msg)
        if reply is not None and msg.metadata.message_type == "train" and reply.has_content():
            replies.append({k: v.numpy().dtype for k, v in reply.content["arrays"].items()})
        return reply

    grid._deliver = spy
    cfg = RunConfig.from_dict({"method": "fedavg", "dataset": "digits", "model": "mlp", "num-server-rounds": 2,
                               "seed": 3, "batch-size": 16, "lr": 0.05, "checkpoint": False,
                               "out-dir": str(tmp_path / name)})
    doc = run_federation(grid, cfg)
    final = torch.load(tmp_path / name / "final_model.pt")
    assert all(r["num_failures"] == 0 for r in doc["rounds"]), [r["failures"] for r in doc["rounds"]]
    return np.concatenate([v.numpy().ravel() for v in final.values()]), doc["rounds"][-1]["global_accuracy"], replies


def test_a_bf16_node_and_fp32_nodes_train_one_model(tmp_path):
    """A node's operator may set its own precision (node config): its updates are fp32 arrays like the others',
    the federation aggregates them, and the result is the fp32 federation's up to bf16 rounding."""
    import numpy as np

    w32, acc32, _ = _federation({}, tmp_path, "fp32")
    w_mix, acc_mix, replies = _federation({0: "bf16-mixed"}, tmp_path, "mixed")
    assert replies and all(dt == np.float32 for r in replies for dt in r.values())
    assert not np.array_equal(w_mix, w32)                       # node 0 did compute in bf16
    assert np.linalg.norm(w_mix - w32) < 0.05 * np.linalg.norm(w32)
    assert abs(acc_mix - acc32) < 0.05


def test_a_node_precision_it_cannot_run_is_an_error_naming_the_node_config():
    from client_app.app import ClientSetupError, node_numerics

    cfg = RunConfig.from_dict({"method": "scaffold"})
    assert node_numerics(cfg, {"precision": "bf16-mixed"}, CPU) == Numerics("bf16-mixed")
    with pytest.raises(ClientSetupError, match=r"needs a CUDA device.*node config \{'precision': 'fp16-mixed'\}"):
        node_numerics(RunConfig.from_dict({"method": "fedavg"}), {"precision": "fp16-mixed"}, CPU)
    with pytest.raises(ClientSetupError, match="method 'scaffold' does not take precision = 'fp16-mixed'"):
        node_numerics(cfg, {"precision": "fp16-mixed"}, torch.device("cuda"))
    with pytest.raises(ClientSetupError, match="precision must be one of"):
        node_numerics(cfg, {"precision": "half"}, CPU)


def test_under_the_block_losses_and_linear_algebra_run_in_fp32():
    """What models/numerics.py's docstring states of CPU autocast (a torch release that changes it shows here)."""
    model = conv_net()
    z = torch.randn(8, 8, dtype=torch.bfloat16)
    y = torch.randint(0, 8, (8,))
    with applied(model, BF16, CPU):
        assert F.cross_entropy(z, y).dtype == torch.float32
        assert F.mse_loss(z, z).dtype == torch.float32
        assert F.kl_div(z, z, reduction="batchmean").dtype == torch.float32
        assert torch.linalg.inv(z.float() + 8 * torch.eye(8)).dtype == torch.float32
        assert F.softmax(z, 1).dtype == torch.bfloat16                  # follows its input
        assert (torch.randn(4, 4, dtype=torch.float64) @ torch.randn(4, 4, dtype=torch.float64)).dtype == torch.float64
