"""Issue 42, item 5: a participant that never replies stops costing every round its round-timeout.

After ``evict-after-timeouts`` exchanges in a row without a reply a client is evicted: not sampled nor evaluated;
a liveness probe (a "query", waiting ``probe-timeout``) asks it again after 1, 2, 4, ... rounds, and a client that
answers trains again. Real round driver and ClientApp through tests/fakegrid.py."""

from __future__ import annotations

from flcore import protocol
from flcore.config import RunConfig, resolve_run_config
from server_app.runner import run_federation
from tests.fakegrid import FakeGrid

JOB = {"dataset": "digits", "batch-size": 16, "max-local-steps": 2, "model": "mlp", "checkpoint": False,
       "round-timeout": 0.3, "probe-timeout": 0.2, "evict-after-timeouts": 2, "min-train-nodes": 3}


class GoesSilent:
    """Answers its registration, then nothing (training, evaluation, probes) in rounds ``start``..``end``."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __call__(self, msg, reply):
        rnd = int(msg.metadata.group_id or 0)
        first_registration = msg.metadata.message_type == protocol.QUERY and rnd <= 1 and self.start > 1
        if self.start <= rnd <= self.end and not first_registration:
            return None
        return reply


def run(tmp_path, behaviour, **over):
    cfg = RunConfig.from_dict(resolve_run_config({**JOB, **over, "out-dir": str(tmp_path / "run")}))
    grid = FakeGrid(4, {3: behaviour}, behaviour_phases=("query", "train", "evaluate"))
    return run_federation(grid, cfg)


def test_a_silent_client_is_evicted_probed_with_back_off_and_trains_again_once_it_answers(tmp_path):
    doc = run(tmp_path, GoesSilent(2, 6), **{"num-server-rounds": 9})
    sampled = [r["sampled"] for r in doc["rounds"]]
    assert sampled[0] == [0, 1, 2, 3]                      # round 1: it answers
    assert 3 in sampled[1] and 3 in sampled[2]               # rounds 2-3: two timeouts in a row
    assert all(3 not in s for s in sampled[3:6])             # evicted: rounds 4-6 do not wait for it
    assert all(s == [0, 1, 2, 3] for s in sampled[6:])      # it answered the probe of round 7: trains again
    kinds = [(r["round"], f["phase"], f["kind"]) for r in doc["rounds"] for f in r["failures"] if f["cid"] == 3]
    assert (2, "train", "timeout") in kinds and (3, "train", "timeout") in kinds
    evicted = [f for r in doc["rounds"] for f in r["failures"] if f["cid"] == 3 and f["kind"] == "evicted"]
    assert "2 exchanges in a row without a reply (each waited up to round-timeout = 0.3 s)" in evicted[0]["reason"]
    # unanswered probes in rounds 4 and 5 (then asked after 2 rounds: 7, which it answered)
    probes = [r["round"] for r in doc["rounds"] for f in r["failures"] if f["phase"] == "probe"]
    assert probes == [4, 5]
    assert all(r["num_updates"] == 3 for r in doc["rounds"][3:6]) and doc["rounds"][6]["num_updates"] == 4


def test_a_client_that_never_answers_costs_the_probes_only(tmp_path):
    doc = run(tmp_path, GoesSilent(2, 99), **{"num-server-rounds": 8})
    timeouts = sum(1 for r in doc["rounds"] for f in r["failures"] if f["cid"] == 3 and f["kind"] == "timeout")
    assert timeouts == 2  # the two that evicted it; 6 rounds later it has cost 3 probes of 0.2 s, not 6 x 0.3 s
    assert [r["round"] for r in doc["rounds"] for f in r["failures"] if f["phase"] == "probe"] == [4, 5, 7]


def test_evict_after_timeouts_zero_keeps_asking(tmp_path):
    doc = run(tmp_path, GoesSilent(2, 99), **{"num-server-rounds": 5, "evict-after-timeouts": 0})
    assert all(3 in r["sampled"] for r in doc["rounds"])
    assert not [f for r in doc["rounds"] for f in r["failures"] if f["kind"] == "evicted"]


def test_the_eviction_state_survives_a_checkpoint():
    from types import SimpleNamespace

    from strategies.client_registry import ClientInfo, ClientRegistry
    from strategies.exchange import ExchangeResult, Failure

    cfg = RunConfig.from_dict(resolve_run_config({"evict-after-timeouts": 2}))
    reg = ClientRegistry(cfg, query=lambda: None)
    reg.clients = {c: ClientInfo(c, 10 + c, 5, [5]) for c in range(3)}
    for _ in range(2):
        reg.forget_lost(ExchangeResult(replies={0: SimpleNamespace()}, failures=[Failure(2, "train", "timeout", "t")]))
    assert reg.eligible() == [0, 1] and reg.timeouts == {2: 2} and reg.evicted == {2: (0, 0)}
    back = ClientRegistry(cfg, query=lambda: None)
    back.load_state_dict(reg.state_dict())
    assert (back.timeouts, back.evicted) == ({2: 2}, {2: (0, 0)})
    reg.forget_lost(ExchangeResult(replies={2: SimpleNamespace()}))  # a reply resets the count (not the eviction)
    assert reg.timeouts == {} and reg.evicted == {2: (0, 0)}
