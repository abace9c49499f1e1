"""The speed-ups on the message path keep results exact: the .npy codec of flcore/records.py gives Flower's
bytes and numpy's arrays, and the ClientApp's model pool (client_app/model_pool.py) hands a model out
again only when it is as good as new."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from client_app.model_pool import ModelPool
from flcore.config import RunConfig, resolve_run_config
from flcore.records import model_params, params_to_record, record_to_params
from models import build_model

ARRAYS = [np.ones((), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(10, dtype=np.int64),
          np.zeros((0, 5), np.float32), np.asfortranarray(np.arange(12.0).reshape(3, 4)),
          np.linspace(0, 1, 24).astype(np.float16).reshape(2, 3, 4), np.array([True, False]),
          np.arange(7, dtype=np.uint8), np.array(5, dtype=">i4"), np.zeros((300, 200), np.float64)]


@pytest.mark.parametrize("i", range(len(ARRAYS)))
def test_encoding_gives_flowers_bytes_and_decoding_numpys_array(i):
    a = ARRAYS[i]
    for _ in range(2):  # the second time through the memoized header
        rec = params_to_record({"x": a})
        ref = Array(np.ascontiguousarray(a))  # what the code did before: Flower's own np.save
        assert (rec["x"].data, rec["x"].dtype, rec["x"].shape, rec["x"].stype) == (ref.data, ref.dtype, ref.shape,
                                                                                   ref.stype)
        for record in (rec, ArrayRecord({"x": Array(a)})):  # ours and Flower's encoding (Fortran order kept)
            got, want = record_to_params(record)["x"], record["x"].numpy()
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
            assert got.flags.writeable and got.flags.c_contiguous == want.flags.c_contiguous
            assert got.flags.f_contiguous == want.flags.f_contiguous


def test_decoded_arrays_are_independent_of_the_message_bytes():
    rec = params_to_record({"w": np.arange(4, dtype=np.float32)})
    a = record_to_params(rec)["w"]
    a[0] = 99.0
    assert record_to_params(rec)["w"][0] == 0.0


def test_bad_bytes_still_fail_like_numpy():
    good = params_to_record({"w": np.arange(4, dtype=np.float32)})["w"]
    truncated = Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=good.data[:-4])
    with pytest.raises(ValueError):
        record_to_params(ArrayRecord({"w": truncated}))


# ============================================================================ model pool
@pytest.fixture
def setup():
    cfg = RunConfig.from_dict(resolve_run_config({"dataset": "digits"}))
    params = dict(model_params(build_model(cfg, (1, 8, 8), 10)))
    pool = ModelPool()
    return cfg, params, pool, lambda: build_model(cfg, (1, 8, 8), 10)


def _get(pool, build, params, seed=0):
    model = pool.get("k", build, seed)
    pool.load(model, params)
    return model


def test_a_reused_model_behaves_exactly_like_a_new_one(setup):
    cfg, params, pool, build = setup
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.arange(16) % 10

    def one_step(model):
        draw = torch.rand(3)  # a trainer drawing from the global RNG right after getting its model
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return draw, {k: v.detach().clone() for k, v in model.state_dict().items()}

    first = _get(pool, build, params)
    ref_draw, ref_state = one_step(first)
    assert pool.give_back(first) and pool.builds == 1
    del first
    for _ in range(3):
        model = _get(pool, build, params)
        assert model.training and all(p.grad is None for p in model.parameters())
        draw, state = one_step(model)
        assert torch.equal(draw, ref_draw)
        assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)
        model.eval()  # left in eval mode: the next user still gets a training-mode model
        assert pool.give_back(model)
        del model
    assert pool.builds == 1 and pool.reuses == 3


@pytest.mark.parametrize("change", ["flag", "replaced module", "replaced parameter", "nested module added",
                                    "module removed"])
def test_a_model_whose_structure_changed_is_not_reused(setup, change):
    """The pool's public-API check (client_app/model_pool.py): the module, parameter and buffer objects and
    their requires_grad are the ones built; anything else costs a rebuild."""
    cfg, params, pool, build = setup
    model = _get(pool, build, params)
    if change == "flag":
        model.head.weight.requires_grad_(False)
    elif change == "replaced module":
        model.head = torch.nn.Linear(model.feature_dim, 10)
    elif change == "replaced parameter":
        model.head.bias = torch.nn.Parameter(torch.zeros(10))
    elif change == "nested module added":  # deep in the tree: only that module's children changed
        next(m for m in model.backbone.modules() if not list(m.children())).add_module("extra", torch.nn.ReLU())
    elif change == "module removed":
        leaf = next(n for n, m in model.backbone.named_modules() if n and not list(m.children()))
        parent, _, name = leaf.rpartition(".")
        delattr(model.backbone.get_submodule(parent) if parent else model.backbone, name)
    assert not pool.give_back(model)
    del model
    fresh = _get(pool, build, params)
    assert pool.builds == 2 and pool.reuses == 0
    assert pool.give_back(fresh)


def test_a_reused_model_comes_back_in_training_mode_without_gradients(setup):
    cfg, params, pool, build = setup
    model = _get(pool, build, params)
    torch.nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.arange(4)).backward()
    model.eval()
    assert pool.give_back(model)
    again = _get(pool, build, params)
    assert again is model and again.training and all(m.training for m in again.modules())
    assert all(p.grad is None for p in again.parameters())


def test_loading_checks_names_and_shapes_like_load_state_dict(setup):
    cfg, params, pool, build = setup
    model = _get(pool, build, params)
    bad = dict(params)
    bad["head.bias"] = np.zeros(3, np.float32)
    with pytest.raises(RuntimeError, match="size mismatch"):
        pool.load(model, bad)
    missing = {k: v for k, v in params.items() if k != "head.bias"}
    with pytest.raises(RuntimeError, match="Missing key"):
        pool.load(model, missing)
    pool.load(model, params)
    assert all(torch.equal(model.state_dict()[k], torch.from_numpy(v)) for k, v in params.items())


def test_the_pool_forgets_its_least_recently_used_key_and_keeps_taking_new_ones(setup):
    """A sweep in one process brings a new key per run: the pool must keep pooling the newest ones (it used to
    stop taking keys once full, and every later message rebuilt its model)."""
    cfg, params, _, build = setup
    pool = ModelPool(max_keys=2)

    def use(key):
        model = pool.get(key, build, 0)
        pool.load(model, params)
        assert pool.give_back(model)

    for key in ("a", "b", "a", "c"):  # c arrives when full: b, the least recently used, is forgotten
        use(key)
    assert list(pool._entries) == ["a", "c"] and pool.builds == 3 and pool.reuses == 1
    use("c")
    use("a")
    assert pool.builds == 3 and pool.reuses == 3
    use("b")  # forgotten: built anew, and c (least recently used now) goes
    assert pool.builds == 4 and list(pool._entries) == ["a", "b"]


def test_a_model_whose_key_was_forgotten_while_out_is_not_taken_back(setup):
    cfg, params, _, build = setup
    pool = ModelPool(max_keys=1)
    out = pool.get("a", build, 0)
    first = pool.get("b", build, 0)  # "a" is forgotten while its model is out
    assert pool.give_back(first)
    del first
    again = pool.get("a", build, 0)  # "a" is a new entry now, and "b" is forgotten
    assert not pool.give_back(out)  # the old entry's model: not mixed into the new one's
    assert pool.give_back(again) and [len(e.free) for e in pool._entries.values()] == [1]


def test_many_runs_in_one_process_keep_reusing_models(tmp_path):
    """Ten runs in one process (every run config differs by its out-dir): the last one still reuses the model for
    all but its first message (measured before the fix: from the ninth run on, 200 builds per 20-round run)."""
    from client_app.model_pool import POOL
    from engines.local import run_local

    job = {"dataset": "digits", "model": "logistic", "num-server-rounds": 2, "checkpoint": False,
           "federated-eval-every": 0}
    for k in range(POOL.max_keys + 2):
        builds, reuses = POOL.builds, POOL.reuses
        run_local({**job, "out-dir": str(tmp_path / str(k))}, 3, engine="inprocess", workers=1)
    assert POOL.builds - builds == 1 and POOL.reuses - reuses == 2 * 3 - 1
