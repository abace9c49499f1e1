"""The parts FLStrategy is composed of (strategies/base.py), each through its own small interface: the client
registry (seeded sampling, registration back-off), the state ledger (what a checkpoint keeps of it), the update
checks (why an update is refused), the message builder and the round driver (retries over its given steps)."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from flcore.config import RunConfig, resolve_run_config
from flcore.protocol import CLIENT_STATE, STATE_ENTRIES, STATE_MISSING
from flcore.records import params_to_record
from flcore.state_binding import StateBinding
from strategies import round_driver
from strategies.base import FLStrategy
from strategies.client_registry import ClientInfo, ClientRegistry
from strategies.exchange import ExchangeResult, Failure
from strategies.messages import MessageBuilder
from strategies.round_driver import RoundDriver
from strategies.state_ledger import ClientStateMissing, StateLedger
from strategies.update_checks import ClientUpdate, UpdateChecks


def config(**over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({k.replace("_", "-"): v for k, v in over.items()}))


def registry(n: int, **over) -> ClientRegistry:
    reg = ClientRegistry(config(**over), query=RecordDict)
    for cid in range(n):
        reg.clients[cid] = ClientInfo(cid, 100 + cid, 10 + cid, [1, 1])
    return reg


# ------------------------------------------------------------------------------------------------ registry
def test_the_registry_samples_from_its_seeded_stream_reproducibly():
    a, b, other = registry(20, fraction_train=0.25), registry(20, fraction_train=0.25), registry(20, seed=1,
                                                                                                  fraction_train=0.25)
    rounds = [a.sample() for _ in range(4)]
    assert rounds == [b.sample() for _ in range(4)]                  # same seed, same clients every round
    assert [other.sample() for _ in range(4)] != rounds
    assert all(len(r) == 5 and r == sorted(set(r)) and set(r) <= set(range(20)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1                        # a new draw each round
    assert len(registry(3, fraction_train=0.1, min_train_nodes=2).sample()) == 2   # at least min-train-nodes


def test_the_registry_checkpoint_resumes_the_sampling_stream_and_accuracies():
    a = registry(12, fraction_train=0.5)
    a.sample()
    a.note_accuracy([SimpleNamespace(cid=3, metrics={"local-accuracy": 0.75}), SimpleNamespace(cid=4, metrics={})])
    state = a.state_dict()
    assert set(state) == {"rng", "client_accuracy", "local_model_accuracy", "timeouts", "evicted"}
    assert state["client_accuracy"] == {3: 0.75}
    b = registry(12, fraction_train=0.5, seed=7)
    b.load_state_dict(state)
    assert [b.sample() for _ in range(3)] == [a.sample() for _ in range(3)] and b.accuracy == {3: 0.75}


def test_the_registry_backs_off_a_node_that_fails_to_register(monkeypatch):
    """A node whose registration fails is asked again after 1, 2, 4 rounds, each failure drained once."""
    from strategies import client_registry

    asked: list[tuple[int, list[int]]] = []

    def failing(grid, sends, message_type, timeout, server_round, phase=None, poll=0.1):
        asked.append((server_round, [node for node, _ in sends.values()]))
        return ExchangeResult(failures=[Failure(key, phase, "timeout", "no reply") for key in sends])

    monkeypatch.setattr(client_registry, "exchange", failing)
    reg = registry(0, min_train_nodes=0)
    grid = SimpleNamespace(get_node_ids=lambda: [42])
    for rnd in range(1, 9):
        reg.refresh(grid, wait=False, server_round=rnd)
    assert [r for r, _ in asked] == [1, 2, 4, 8] and reg.backoff[42] == (4, 16)
    reasons = [f.reason for f in reg.drain_failures()]
    assert reasons[0] == "node 42: no reply (attempt 1; asked again in round 2)" and len(reasons) == 4
    assert reg.drain_failures() == []


# ------------------------------------------------------------------------------------------------ ledger
def test_the_ledger_records_survive_a_checkpoint_and_resume():
    ledger = StateLedger.fresh()
    ledger.note_reply(3, 1, {STATE_ENTRIES: 2})
    ledger.note_reply(4, 1, {STATE_ENTRIES: 0})                        # empty state: nothing to find later
    ledger.note_reply(5, 2, {STATE_ENTRIES: 1})
    ledger.note_reply(6, 2, {})                                       # a client that does not report it
    ledger.checkpoint_written(2)
    saved = ledger.to_dict()
    assert saved["rounds"] == {3: 1, 5: 2} and saved["starts"] == [1]
    back = StateLedger.resumed(saved, 1, "fedavg")                    # resumed from the checkpoint of round 1
    assert back.run == ledger.run and back.attempts[0] == ledger.attempts[0] and len(back.attempts) == 2
    assert (back.starts, back.rounds, back.checkpoint_round) == ([1, 2], {3: 1}, 1)
    assert back.binding(3) == StateBinding(back.run, tuple(back.attempts), (1, 2), 1, 1)
    assert dict(back.record(3)) == dict(back.binding(3).to_record())
    back.check_refusals([Failure(3, "train", "error", "code 0: out of memory")])   # an ordinary failure: goes on
    back.check_refusals([Failure(5, "train", "error", f"code 0: {STATE_MISSING}")])  # kept it after round 1 only
    with pytest.raises(ClientStateMissing, match="resumed after round 1 without its clients' state"):
        back.check_refusals([Failure(3, "train", "error", f"code 0: {STATE_MISSING}: client 3")])


def test_a_strategy_binds_its_own_ledger_when_the_run_begins():
    s = FLStrategy(config())
    params = OrderedDict(w=np.zeros(2, np.float32))
    assert s.ledger is None and CLIENT_STATE not in s.train_content(1, 0, params)   # Flower's start(): none
    assert set(s.state_dict()) == {"rng", "client_accuracy", "local_model_accuracy", "timeouts", "evicted"}
    s.begin_run()
    first = s.ledger
    assert isinstance(s.train_content(1, 0, params)[CLIENT_STATE], ConfigRecord)
    first.note_reply(0, 1, {STATE_ENTRIES: 1})
    s.begin_run(resumed_after=1, client_state=first.to_dict())
    assert s.ledger.run == first.run and s.ledger.rounds == {0: 1} and s.ledger.starts == [1, 2]
    with pytest.raises(ClientStateMissing, match="scaffold keeps client state"):
        FLStrategy(config(method="scaffold")).begin_run(resumed_after=3, client_state=None)


# ------------------------------------------------------------------------------------------------ update checks
def _reply(params, num: int) -> SimpleNamespace:
    return SimpleNamespace(content=RecordDict({"arrays": params_to_record(params),
                                               "metrics": MetricRecord({"num-examples": num, "train_loss": 0.1})}))


def test_the_update_checks_reject_nan_oversized_and_misreported_updates_and_say_why():
    ref = OrderedDict(w=np.zeros(4, np.float32), b=np.zeros(2, np.float32))
    checks = UpdateChecks(config(max_update_norm=5.0), registered_samples={0: 10, 1: 10, 2: 10, 3: 10}.get)
    replies = {0: _reply(OrderedDict(w=np.full(4, 0.5, np.float32), b=np.zeros(2, np.float32)), 10),
               1: _reply(OrderedDict(w=np.array([0, np.nan, 0, 0], np.float32), b=np.zeros(2, np.float32)), 10),
               2: _reply(OrderedDict(w=np.full(4, 3.0, np.float32), b=np.zeros(2, np.float32)), 10),
               3: _reply(OrderedDict(w=np.zeros(4, np.float32), b=np.zeros(2, np.float32)), 99),
               4: SimpleNamespace(content=RecordDict({"metrics": MetricRecord({"num-examples": 1})}))}
    checked = checks.check(1, replies, ref)
    assert [u.cid for u in checked.updates] == [0] and checked.norms[0].lo <= 1.0 <= checked.norms[0].hi
    why = {f.cid: f.reason for f in checked.rejected}
    assert why[1] == "tensor 'w' contains NaN or Inf"
    assert why[2] == "update norm 6 exceeds max-update-norm 5"
    assert why[3].startswith("reply claims num-examples=99, but the client registered 10 training samples")
    assert why[4] == "malformed reply: record 'arrays' missing"
    assert sorted(checked.metrics) == [0, 1, 2, 3]                    # every well-formed reply: the ledger's input


def test_the_relative_screen_rejects_an_outlier_against_the_round_median():
    ref = OrderedDict(w=np.zeros(3, np.float64))
    checks = UpdateChecks(config(update_norm_factor=3.0, update_norm_scale="none"), registered_samples=lambda c: 10)
    ups = [ClientUpdate(c, OrderedDict(w=np.array([v, 0.0, 0.0])), 10, {}, {}) for c, v in enumerate([1, 1.5, 2, 50])]
    kept, rejected = checks.screen(1, ups, ref, [], "train")
    assert [u.cid for u in kept] == [0, 1, 2]
    assert [(f.cid, f.reason) for f in rejected] == [
        (3, "update norm 50 exceeds update-norm-factor 3 x the round's median update norm (1.75)")]
    assert checks.screen(1, ups[:1] + ups[3:], ref, [], "train")[0] == ups[:1] + ups[3:]   # fewer than 3: no screen


# ------------------------------------------------------------------------------------------------ messages
def test_the_message_builder_shares_records_and_lets_a_method_record_replace_a_base_one():
    builder = MessageBuilder(config())
    params = OrderedDict(w=np.ones(2, np.float32))
    a = builder.train(2, 5, params, {"lam": 0.5}, {"extra": ConfigRecord({"x": 1})})
    assert dict(a["config"]) == {"server-round": 2, "cid": 5, "lam": 0.5} and dict(a["extra"]) == {"x": 1}
    assert a["arrays"] is builder.train(2, 6, params, {}, {})["arrays"] is builder.evaluate(2, 6, params)["arrays"]
    assert a["run_config"] is builder.query()["run_config"] and dict(a["run_config"])["method"] == "fedavg"
    replaced = builder.train(2, 5, params, {}, {"config": ConfigRecord({"own": 1})})
    assert dict(replaced["config"]) == {"own": 1}


# ------------------------------------------------------------------------------------------------ round driver
def test_the_round_driver_retries_with_a_new_sample_until_enough_updates_arrive(monkeypatch):
    reg = registry(4, min_train_replies=2, round_retries=2)
    calls: list[str] = []

    class Steps:
        def sample(self, rnd):
            return reg.sample()

        def train_content(self, rnd, cid, params, message_config=None):
            return RecordDict()

        def collect_updates(self, rnd, replies, reference, phase="train"):
            return [ClientUpdate(c, reference, 10, {}, {}) for c in sorted(replies)], []

        def aggregate(self, rnd, params, updates):
            return OrderedDict(w=np.array([float(len(updates))]))

        def check_client_state(self, failures):
            calls.append(",".join(f.kind for f in failures))

    attempts = iter([{0: "node-lost", 1: "ok", 2: "error", 3: "error"}, {0: "ok", 1: "ok", 2: "ok", 3: "error"}])

    def scripted(grid, sends, message_type, timeout, server_round, phase=None, poll=0.1):
        outcome = next(attempts)
        return ExchangeResult(replies={c: SimpleNamespace() for c in sends if outcome[c] == "ok"},
                              failures=[Failure(c, "train", outcome[c], "x") for c in sends if outcome[c] != "ok"])

    monkeypatch.setattr(round_driver, "exchange", scripted)
    monkeypatch.setattr(reg, "refresh", lambda grid, wait=True, server_round=0: None)
    out = RoundDriver(reg.cfg, reg, Steps()).train_round(None, 1, OrderedDict(w=np.zeros(1)))
    assert out.params["w"][0] == 2.0 and [u.cid for u in out.updates] == [1, 2]     # 0 was lost: not sampled again
    assert calls == ["node-lost,error,error", "error"]                # the ledger sees every attempt's failures
    assert [(f.cid, f.kind) for f in out.failures] == [(0, "node-lost"), (2, "error"), (3, "error"), (3, "error")]
    assert sorted(reg.clients) == [1, 2, 3]                           # the lost node must register again
