"""Issue 31 item 8: the relative update screen keeps honest heavy clients. Its limit (update-norm-factor x
the round's median norm) grows, for a client whose registered samples allow more local steps than the
round's median client, with ||a||_1 of those steps (strategies/update_screen.py); light clients are screened
as before, and the faults it was built for are still rejected (tests/test_update_screening.py, and below)."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.records import params_to_record, record_to_params
from server_app.runner import build_strategy, run_federation
from strategies.base import ClientUpdate
from strategies.methods.fednova import a_norm
from strategies.update_screen import check_update, relative_limits, relative_screen, step_scale
from tests.fakegrid import FakeGrid


def test_step_scale_is_the_momentum_weighted_step_count_of_the_registered_samples():
    assert step_scale(100, 1, 32, 0, 0.0) == 4.0  # ceil(100 / 32) plain SGD steps
    assert step_scale(100, 3, 32, 0, 0.0) == 12.0
    assert step_scale(100, 3, 32, 5, 0.0) == 5.0  # max-local-steps caps it
    assert step_scale(0, 1, 32, 0, 0.9) == 0.0
    assert step_scale(1, 1, 32, 0, 0.9) == 1.0  # one step moves lr * g whatever the momentum
    assert step_scale(320, 1, 32, 0, 0.9) == pytest.approx(a_norm(10, 0.9)) == pytest.approx(41.38, abs=0.01)
    # an update of s momentum steps with gradients of norm G moves at most lr G ||a||_1: check on a constant gradient
    lr, g, rho, w, v = 0.1, 2.0, 0.9, 0.0, 0.0
    for _ in range(10):
        v = rho * v + g
        w -= lr * v
    assert abs(w) == pytest.approx(lr * g * step_scale(320, 1, 32, 0, rho))


def test_equal_scales_are_the_old_rule_and_light_clients_are_not_screened_harder():
    norms = [1.0, 1.2, 0.9, 11.9, 12.1]
    assert [bad for bad, _ in relative_screen(norms, [1.0] * 5, 10.0)] == [False, False, False, False, True]
    assert relative_limits(norms, [1.0] * 5, 10.0) == [10 * 1.2] * 5
    # a light client (scale 0.1 of the median) keeps factor x median; a heavy one (5x) gets 5x that
    assert relative_limits(norms, [4.0, 40.0, 40.0, 200.0, 40.0], 10.0) == [12.0, 12.0, 12.0, 60.0, 12.0]
    # rounds of tiny clients (median scale below one step) use one step as the reference
    assert relative_limits([1.0, 1.0, 1.0], [0.0, 0.0, 3.0], 2.0) == [2.0, 2.0, 6.0]


def _update(cid: int, length: float, samples: int) -> ClientUpdate:
    return ClientUpdate(cid, {"w": np.array([length, 0, 0, 0], np.float32)}, samples, {}, {})


def _strategy(tmp_path, **over):
    cfg = RunConfig.from_dict(resolve_run_config({"batch-size": 32, "local-epochs": 1, "momentum": 0.9,
                                                  "out-dir": str(tmp_path), **over}))
    return build_strategy(cfg)


@pytest.mark.parametrize("bracketed", [True, False])
def test_an_honest_heavy_client_passes_and_a_scaled_update_does_not(tmp_path, bracketed):
    """Five clients of 64-320 samples (2-10 steps at B 32): the 320-sample client's norm of 30 x the median
    (as under strong label skew) passes under its limit of 10 x median x a(10)/a(3) = 73.8 x median; the same client's
    update 1000 x longer, or a median client's 11 x longer, is rejected, naming the limits."""
    strategy = _strategy(tmp_path)
    ref = {"w": np.zeros(4, np.float32)}
    ratio = step_scale(320, 1, 32, 0, 0.9) / step_scale(96, 1, 32, 0, 0.9)
    assert ratio == pytest.approx(a_norm(10, 0.9) / a_norm(3, 0.9)) == pytest.approx(7.376, abs=0.001)

    def screen(ups):
        norms = {u.cid: check_update(u.params, ref, 1e9)[1] for u in ups} if bracketed else None
        kept, rejected = strategy.checks.screen(1, ups, ref, [], "train", norms)
        return [u.cid for u in kept], {f.cid: f.reason for f in rejected}

    honest = [_update(0, 1.0, 64), _update(1, 1.0, 96), _update(2, 1.1, 96), _update(3, 0.9, 128),
              _update(4, 30.0, 320)]
    assert screen(honest) == ([0, 1, 2, 3, 4], {})
    kept, why = screen(honest[:4] + [_update(4, 30000.0, 320)])
    assert kept == [0, 1, 2, 3]
    assert why[4] == ("update norm 3e+04 exceeds update-norm-factor 10 x the round's median update norm (1) "
                      f"x {ratio:.3g} for its 320 registered samples")
    kept, why = screen([_update(0, 1.0, 64), _update(1, 11.0, 96), _update(2, 1.1, 96), _update(3, 0.9, 128),
                        _update(4, 1.0, 320)])
    assert kept == [0, 2, 3, 4]
    assert why[1] == "update norm 11 exceeds update-norm-factor 10 x the round's median update norm (1)"
    # update-norm-scale='none': one limit for everyone, as before issue 31: the honest heavy client goes
    strategy = _strategy(tmp_path, **{"update-norm-scale": "none"})
    assert screen(honest)[0] == [0, 1, 2, 3]


def test_the_bracket_and_the_exact_norms_decide_alike_with_scales(tmp_path):
    """Near ties at a scaled limit: exactly at it (kept) and one float32 ulp above (rejected)."""
    strategy = _strategy(tmp_path, momentum=0.0, **{"update-norm-factor": 2.0})
    ref = {"w": np.zeros(4, np.float32)}
    # scales 1, 1, 1, 4 steps: the heavy client's limit is 2 x median (1) x 4 = 8
    for top, kept in ((8.0, [0, 1, 2, 3]), (np.nextafter(np.float32(8.0), np.float32(9.0)), [0, 1, 2])):
        ups = [_update(0, 1.0, 32), _update(1, 1.0, 32), _update(2, 1.0, 32), _update(3, top, 128)]
        norms = {u.cid: check_update(u.params, ref, 1e9)[1] for u in ups}
        got, rejected = strategy.checks.screen(1, ups, ref, [], "train", norms)
        want, want_rejected = strategy.checks.screen(1, ups, ref, [], "train")
        assert [u.cid for u in got] == [u.cid for u in want] == kept
        assert [f.as_dict() for f in rejected] == [f.as_dict() for f in want_rejected]


class HeavyCheater(FakeGrid):
    """The client with the most registered samples returns its model 900 away from the global one."""

    def __init__(self, cheat: int) -> None:
        super().__init__(4)
        self.cheat = cheat

    def _deliver(self, msg):
        reply = super()._deliver(msg)
        if msg.metadata.message_type == "train" and self.node_ids.index(msg.metadata.dst_node_id) == self.cheat:
            sent = record_to_params(msg.content["arrays"])
            params = OrderedDict(record_to_params(reply.content["arrays"]))
            key = next(k for k, v in sent.items() if v.dtype == np.float32 and v.size > 100)
            params[key] = (sent[key] + 900.0 / math.sqrt(sent[key].size)).astype(np.float32)
            reply.content["arrays"] = params_to_record(params)
        return reply


def test_the_heaviest_client_is_still_caught_when_it_sends_a_wild_update(tmp_path):
    """Unequal local steps (no max-local-steps): the heaviest client's limit is raised, a 900-long update is
    still far beyond it (and below max-update-norm 1000: only the relative screen catches it)."""
    base = {"dataset": "digits", "model": "mlp", "num-server-rounds": 1, "batch-size": 16, "checkpoint": False,
            "min-train-nodes": 4, "partition": "dirichlet", "dirichlet-alpha": 0.1, "seed": 6}
    honest = run_federation(FakeGrid(4), RunConfig.from_dict(resolve_run_config({**base, "out-dir": str(tmp_path / "h")})))
    assert honest["rounds"][0]["failures"] == []
    strategy = build_strategy(RunConfig.from_dict(resolve_run_config({**base, "out-dir": str(tmp_path / "x")})))
    strategy.refresh_clients(FakeGrid(4))
    sizes = {cid: c.num_examples for cid, c in strategy.clients.items()}
    heavy = max(sizes, key=sizes.get)
    assert sizes[heavy] > 2 * sorted(sizes.values())[1]  # it does have the most local steps by far
    doc = run_federation(HeavyCheater(heavy), RunConfig.from_dict(resolve_run_config({**base, "out-dir": str(tmp_path / "c")})))
    (failure,) = doc["rounds"][0]["failures"]
    assert failure["cid"] == heavy and "update-norm-factor" in failure["reason"]
    assert f"for its {sizes[heavy]} registered samples" in failure["reason"]


def test_update_norm_scale_is_declared_with_its_choices():
    assert RunConfig.from_dict(resolve_run_config({})).update_norm_scale == "local-steps"
    with pytest.raises(ConfigError, match="update-norm-scale"):
        RunConfig.from_dict(resolve_run_config({"update-norm-scale": "samples"}))


def test_the_protocol_doc_quotes_the_measured_false_rejections():
    """docs/PROTOCOL.md's line on the screen's false rejections is the result file's totals (the one-off study
    benchmarks/screen_rejections.py of commit 2c59ac46 wrote it; benchmarks/results/STUDIES.md)."""
    import json
    import re
    from pathlib import Path

    from flcore.protocol_doc import TEMPLATE

    out = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "screen_rejections.json"
    totals = json.loads(out.read_text())["totals"]
    text = " ".join(TEMPLATE.read_text().split())
    for group, label in (("fmnist", "FedAvg defaults"), ("claim", "settings"), ("replay", "rejected in")):
        m = re.search(re.escape(label) + r": (\d+) of (\d+) updates rejected before, (\d+) now", text)
        assert m, label
        t = totals[group]
        assert tuple(int(g) for g in m.groups()) == (t["old_rejections"], t["updates"], t["shipped_rejections"])
