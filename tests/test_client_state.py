"""Issue 20, item 1: client state bound to a run, versioned by round, resumed at the checkpoint's round.

Every method that keeps state (client state declared in flcore/methods/*, or server state only: the FedBC
variants' lambda_k, gamma_k), killed before, during or after round 3 and resumed from its checkpoint, ends
bit-identical to the uninterrupted run. A kill is an exception (:class:`Killed`, not an ``Exception``, so
nothing on the way catches it) raised by the grid at a chosen message; the resumed run gets a fresh grid,
so every client starts with an empty ``context.state`` and loads its state from disk, as a new process
would. The uninterrupted run keeps its state in memory only. The real SIGKILL of a run in the middle of a
round is in tests/test_client_state_kill.py (slow).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import server_app.runner as runner
from client_app.state import VERSION_NAME
from flcore.config import RunConfig, resolve_run_config
from flcore.registry import get_method, methods
from flcore.state_binding import RECORD, StateBinding
from server_app.checkpoint import load_checkpoint
from server_app.runner import run_federation
from strategies.base import RoundFailed
from strategies.state_ledger import ClientStateMissing
from tests.fakegrid import FakeGrid

NODES = 4
BASE = {"dataset": "digits", "model": "mlp", "num-server-rounds": 4, "batch-size": 16, "lr": 0.05,
        "max-local-steps": 3, "fraction-train": 0.75, "min-train-nodes": 2, "federated-eval-every": 1,
        "local-test-fraction": 0.25, "seed": 3, "round-retries": 0}
# overrides that keep a method's state in use (FedUFO: stage two with CGR from round 3; FedBR: RSM pseudo-data)
OVERRIDES = {"fedbr": {"fedbr.pseudo": "rsm"}, "fedbr-code": {"fedbr-code.pseudo": "rsm", "fedbr-code.rsm-scope": "client"}, "fedufo": {"fedufo.num-clients": NODES, "fedufo.stage-one-fraction": 0.5},
             "fedbc": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1}}
# every method that declares client state, and the FedBC variants (per-client lambda_k, gamma_k on the server)
METHODS = {name: OVERRIDES.get(name, OVERRIDES["fedbc"] if "fedbc" in name else {})
           for name, decl in methods().items() if decl.payload.state or "fedbc" in name}
# where the kill lands: (round, message type prefix, n-th such message of the round, after delivering it)
KILLS = {"before": (3, "train", 1, False),   # round 2 checkpointed, round 3 not started
         "during": (3, "train", 2, True),    # two clients trained round 3 and saved their state, then the kill
         "after": (3, "evaluate", 1, False)}  # every client trained round 3, the server aggregated, no checkpoint
# the row values that must match (all but the wall time)
ROW_KEYS = ("round", "global_accuracy", "global_loss", "local_accuracy", "client_accuracy_mean",
            "client_accuracy_worst", "sampled", "num_updates", "num_failures", "strategy", "per_client",
            "bytes_sent", "bytes_received")


class Killed(BaseException):
    """The process dies here (a BaseException: the exchange's error handling does not catch it)."""


class KillingGrid(FakeGrid):
    """FakeGrid that raises :class:`Killed` at the ``n``-th message of type ``prefix*`` of ``server_round``
    (before that message is handled, or right after, once the client has saved its state)."""

    def __init__(self, num_nodes: int, server_round: int, prefix: str, n: int, after: bool) -> None:
        super().__init__(num_nodes)
        self.kill, self.seen = (str(server_round), prefix, n, after), 0

    def _deliver(self, msg):
        group, prefix, n, after = self.kill
        if msg.metadata.group_id == group and msg.metadata.message_type.startswith(prefix):
            self.seen += 1
            if self.seen == n:
                if after:
                    super()._deliver(msg)
                raise Killed(f"killed at {prefix} message {n} of round {group}")
        return super()._deliver(msg)


def make_cfg(out: Path, method: str, **over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({**BASE, **METHODS.get(method, {}), "method": method,
                                                   "out-dir": str(out), **over}))


def rows(out: Path) -> list[dict]:
    """The round rows' compared values; a strategy's wall-time entries (GNE's ``gne-*-seconds``) are left out."""
    doc = json.loads((out / "results.json").read_text())
    return [{k: untimed(r.get(k)) if k == "strategy" else r.get(k) for k in ROW_KEYS} for r in doc["rounds"]]


def untimed(strategy):
    return {k: v for k, v in strategy.items() if not k.endswith("-seconds")} if isinstance(strategy, dict) else strategy


def final(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final_model.pt")


def assert_same_run(a: Path, b: Path) -> None:
    pa, pb = final(a), final(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), f"tensor {k} differs"
    assert rows(a) == rows(b)


def versions(state_dir: Path) -> dict[int, list[tuple[int, str]]]:
    """client id -> [(round, attempt)] of every state version on disk (one run directory expected)."""
    runs = list(state_dir.glob("run-*"))
    assert len(runs) <= 1, runs
    out: dict[int, list[tuple[int, str]]] = {}
    for client in sorted(runs[0].glob("client-*")) if runs else []:
        names = [VERSION_NAME.match(p.name) for p in client.iterdir()]
        out[int(client.name.split("-")[1])] = sorted((int(m.group(1)), m.group(2)) for m in names if m)
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """method -> output dir of its uninterrupted 4-round run (state in memory only), run once per module."""
    done: dict[str, Path] = {}

    def get(method: str) -> Path:
        if method not in done:
            out = tmp_path_factory.mktemp(f"full-{method}")
            run_federation(FakeGrid(NODES), make_cfg(out, method))
            done[method] = out
        return done[method]
    return get


@pytest.fixture
def every_round_checkpoint(monkeypatch):
    monkeypatch.setattr(runner, "WRITE_INTERVAL_S", 0.0)  # a checkpoint after every round, however fast


def test_the_methods_killed_here_include_every_one_with_client_state():
    assert {"scaffold", "moon", "feddyn", "fedufo", "fedbr", "fedbc", "fedbc-finetune", "per-fedbc"} <= set(METHODS)
    assert {m for m in METHODS if get_method(m).payload.state} == {"scaffold", "moon", "feddyn", "fedufo", "fedbr",
                                                                   "fedbr-code", "local", "ditto", "fedper", "fedrod",
                                                                   "pfedme", "fml", "apple", "fedrane-code"}


def kill_and_resume(tmp_path: Path, method: str, kill: tuple, **over) -> tuple[Path, Path, dict]:
    """Run until the kill, then resume with a fresh grid; returns (run dir, state dir, versions at the kill)."""
    out, state = tmp_path / "run", tmp_path / "state"
    cfg = make_cfg(out, method, **{"client-state-dir": str(state), **over})
    with pytest.raises(Killed):
        run_federation(KillingGrid(NODES, *kill), cfg)
    at_kill = versions(state)
    run_federation(FakeGrid(NODES), make_cfg(out, method, **{"client-state-dir": str(state), **over,
                                                            "resume-from": str(out)}))
    return out, state, at_kill


@pytest.mark.parametrize("point", sorted(KILLS))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_killed_then_resumed_equals_uninterrupted(method, point, tmp_path, uninterrupted, every_round_checkpoint):
    out, state, at_kill = kill_and_resume(tmp_path, method, KILLS[point])
    assert_same_run(uninterrupted(method), out)
    if get_method(method).payload.state and point != "before":
        # the case: clients had saved round-3 state that the checkpoint (round 2) does not cover
        assert any(r == 3 for vs in at_kill.values() for r, _ in vs), at_kill
    # the thrown-away history is gone: every version left was written by the resumed attempt or before round 3
    after = versions(state)
    attempts = {a for vs in after.values() for r, a in vs if r >= 3}
    assert all(r < 3 or a in attempts for vs in after.values() for r, a in vs)
    assert len(attempts) <= 1
    assert all(len(vs) <= 2 for vs in after.values()), after  # the two newest (the last checkpoint is round 4)


def test_fedufo_killed_between_its_prior_and_posterior_phases(tmp_path, uninterrupted, every_round_checkpoint):
    out, _, at_kill = kill_and_resume(tmp_path, "fedufo", (3, "train.posterior", 1, False))
    assert any(r == 3 for vs in at_kill.values() for r, _ in vs)  # priors of round 3 were in client state
    assert_same_run(uninterrupted("fedufo"), out)


def test_a_lagging_checkpoint_keeps_the_version_it_needs(tmp_path, monkeypatch):
    """Checkpoints are written at most every WRITE_INTERVAL_S (and after the last round): with a long interval
    only round 1 is checkpointed; clients train rounds 2, 3 and part of 4 before the kill, and each still
    holds its version of round 1 (not only its two newest), so the resume from round 1 is exact."""
    monkeypatch.setattr(runner, "WRITE_INTERVAL_S", 1e9)
    out, state = tmp_path / "run", tmp_path / "state"
    over = {"client-state-dir": str(state), "fraction-train": 1.0}
    with pytest.raises(Killed):
        run_federation(KillingGrid(NODES, 4, "train", 2, True), make_cfg(out, "scaffold", **over))
    assert load_checkpoint(str(out), make_cfg(out, "scaffold", **over).to_dict())["round"] == 1
    at_kill = {c: [r for r, _ in vs] for c, vs in versions(state).items()}
    assert at_kill == {0: [1, 3, 4], 1: [1, 3, 4], 2: [1, 2, 3], 3: [1, 2, 3]}
    run_federation(FakeGrid(NODES), make_cfg(out, "scaffold", **over, **{"resume-from": str(out)}))
    full = tmp_path / "full"
    run_federation(FakeGrid(NODES), make_cfg(full, "scaffold", **{"fraction-train": 1.0}))
    assert_same_run(full, out)


# ------------------------------------------------------------------------------------------ refusals
def test_a_stateful_method_resumed_without_its_client_state_is_refused(tmp_path, every_round_checkpoint):
    out, state = tmp_path / "run", tmp_path / "state"
    over = {"fraction-train": 1.0}  # every client trains every round: each one has state to miss

    def resume(**more):
        run_federation(FakeGrid(NODES), make_cfg(out, "scaffold", **over, **more, **{"resume-from": str(out)}))

    with pytest.raises(Killed):
        run_federation(KillingGrid(NODES, *KILLS["during"]), make_cfg(out, "scaffold", **over,
                                                                      **{"client-state-dir": str(state)}))
    ckpt = load_checkpoint(str(out), make_cfg(out, "scaffold", **over).to_dict())
    assert ckpt["round"] == 2 and ckpt["client_state"]["rounds"] == {0: 2, 1: 2, 2: 2, 3: 2}
    # no state directory at all
    with pytest.raises(RoundFailed) as exc:
        resume()
    text = str(exc.value)
    assert "client state missing: client 0: run " in text and "scaffold client state (scaffold-c-i) as of round 2" in text
    assert "keeps no client state on disk" in text and "'client-state-dir'" in text
    assert "refusing to restart that state from zero" in text
    # another (empty) state directory: named
    other = tmp_path / "elsewhere"
    with pytest.raises(ClientStateMissing, match=re.escape(f"its state directory {other}/run-") +
                       "[0-9a-f]+/client-[0-9] holds no version of it for this run"):
        resume(**{"client-state-dir": str(other)})
    # one client lost its newest version: the run stops, naming the client and the versions it still has
    for p in next(state.glob("run-*")).glob("client-2/r000002-*.pt"):
        p.unlink()
    with pytest.raises(ClientStateMissing, match="client 2: run .* as of round 2, .* holds only versions of rounds 1;"):
        resume(**{"client-state-dir": str(state)})


def test_a_method_that_kept_no_state_resumes_without_a_state_directory(tmp_path, uninterrupted, every_round_checkpoint):
    """FedBR with mixture pseudo-data declares state but keeps none: nothing is missing, nothing refused."""
    out = tmp_path / "run"
    cfg = make_cfg(out, "fedbr", **{"fedbr.pseudo": "mixture"})
    with pytest.raises(Killed):
        run_federation(KillingGrid(NODES, *KILLS["during"]), cfg)
    run_federation(FakeGrid(NODES), make_cfg(out, "fedbr", **{"fedbr.pseudo": "mixture", "resume-from": str(out)}))
    full = tmp_path / "full"
    run_federation(FakeGrid(NODES), make_cfg(full, "fedbr", **{"fedbr.pseudo": "mixture"}))
    assert_same_run(full, out)


# ------------------------------------------------------------------------------------------ binding to a run
def test_a_new_run_on_the_same_state_dir_never_sees_another_runs_state(tmp_path):
    state = tmp_path / "state"
    run_federation(FakeGrid(NODES), make_cfg(tmp_path / "a", "scaffold", **{"client-state-dir": str(state)}))
    first = {p: p.stat().st_mtime_ns for p in state.rglob("*.pt")}
    # the same job again on the same directory = the same job on no directory (no c_i carried over)
    run_federation(FakeGrid(NODES), make_cfg(tmp_path / "b", "scaffold", **{"client-state-dir": str(state)}))
    run_federation(FakeGrid(NODES), make_cfg(tmp_path / "c", "scaffold"))
    assert_same_run(tmp_path / "c", tmp_path / "b")
    assert len(list(state.glob("run-*"))) == 2  # one directory per run
    assert {p: p.stat().st_mtime_ns for p in first} == first  # the first run's files untouched


def test_every_train_message_says_which_state_and_the_resume_adds_an_attempt(tmp_path, every_round_checkpoint):
    out, state = tmp_path / "run", tmp_path / "state"
    grid = KillingGrid(NODES, *KILLS["after"])
    with pytest.raises(Killed):
        run_federation(grid, make_cfg(out, "moon", **{"client-state-dir": str(state)}))
    resumed = FakeGrid(NODES)
    run_federation(resumed, make_cfg(out, "moon", **{"client-state-dir": str(state), "resume-from": str(out)}))

    def bindings(g, mtype="train"):
        return [(int(m.metadata.group_id), StateBinding.from_record(m.content[RECORD]))
                for m in g.sent if m.metadata.message_type == mtype]
    before, after = bindings(grid), bindings(resumed)
    assert {b.run for _, b in before} == {b.run for _, b in after} and len({b.run for _, b in before}) == 1
    assert {(b.attempts, b.starts) for _, b in before} == {(before[0][1].attempts, (1,))}
    assert {(b.attempts[0], b.starts) for _, b in after} == {(before[0][1].attempt, (1, 3))}
    assert after[0][1].attempt != before[0][1].attempt
    # checkpoint-round: the newest checkpoint on disk when the message left
    assert [(r, b.checkpoint_round) for r, b in before if r <= 3] == [(r, r - 1) for r, _ in before if r <= 3]
    assert all(b.checkpoint_round == r - 1 for r, b in after)
    # state-round: after which round the server saw each client keep state (0 before its first training)
    seen: dict[int, int] = {}
    for (r, b), m in zip(before, [m for m in grid.sent if m.metadata.message_type == "train"]):
        cid = int(m.content["config"]["cid"])
        assert b.state_round == seen.get(cid, 0)
        seen[cid] = r
    assert all(m.content.keys() >= {RECORD} for m in resumed.sent if m.metadata.message_type == "train")
    assert not any(RECORD in m.content for m in resumed.sent if m.metadata.message_type != "train")


def test_a_checkpoint_without_the_client_state_ledger_is_refused_for_a_stateful_method(tmp_path):
    from flcore import safe_files

    for method in ("scaffold", "fedavg"):
        out = tmp_path / method
        run_federation(FakeGrid(NODES), make_cfg(out, method, **{"num-server-rounds": 1}))
        blob = safe_files.load(out / "checkpoint.pt", "checkpoint")
        blob["client_state"] = None  # what save_checkpoint writes when called without a ledger
        safe_files.save(out / "checkpoint.pt", "checkpoint", blob)
        resume = make_cfg(out, method, **{"resume-from": str(out)})
        if method == "scaffold":
            with pytest.raises(ClientStateMissing, match="does not say which run its clients' state belongs to"):
                run_federation(FakeGrid(NODES), resume)
        else:  # a method without client state needs no ledger
            assert len(run_federation(FakeGrid(NODES), resume)["rounds"]) == 4


# ------------------------------------------------------------------------------------------ the files
def binding(**over) -> StateBinding:
    values = {"run": "r1", "attempts": ("a", "b"), "starts": (1, 4), "checkpoint-round": 0, "state-round": 0, **over}
    return StateBinding.from_record(values)


def test_attempts_own_the_rounds_of_their_stretch_of_history():
    b = binding()
    assert [b.owns(r, "a") for r in (1, 2, 3, 4, 5)] == [True, True, True, False, False]
    assert [b.owns(r, "b") for r in (3, 4, 9)] == [False, True, True] and not b.owns(2, "c")
    assert StateBinding.from_record(b.to_record()) == b


@pytest.mark.parametrize("over,match", [
    ({"run": "../x"}, "'run' must be a token"), ({"attempts": ("a",)}, "of one length"),
    ({"starts": (4, 1)}, "'starts' must increase"), ({"state-round": -1}, "rounds must be >= 0")])
def test_a_malformed_client_state_record_is_refused_by_key(over, match):
    with pytest.raises(ValueError, match=match):
        binding(**over)
    with pytest.raises(ValueError, match="lacks state-round"):
        StateBinding.from_record({k: v for k, v in binding().to_record().items() if k != "state-round"})


def test_versions_are_atomic_checked_and_pruned(tmp_path):
    import numpy as np
    from flwr.app import RecordDict

    from client_app.state import ClientState, ClientStateError
    from flcore import safe_files

    def state(rd=None, **over):
        return ClientState(RecordDict() if rd is None else rd, 7, str(tmp_path), binding(**over), 9)

    s = state()
    for rnd in (4, 5, 6):
        s.put_arrays("c", {"w": np.full(3, rnd, np.float32)})
        s.save(rnd)
    folder = tmp_path / "run-r1" / "client-7"
    assert sorted(p.name for p in folder.iterdir()) == ["r000005-b.pt", "r000006-b.pt"]  # the two newest
    # a left-over temporary file (a write killed before its rename) and a version of thrown-away history
    (folder / "r000007-b.pt.tmp999").write_bytes(b"half a file")
    safe_files.save(folder / "r000004-a.pt", "client-state", {})
    fresh = state()
    assert fresh.loaded.round == 6 and fresh.get_arrays("c")["w"].tolist() == [6, 6, 6]
    assert state(state_round=6).loaded.round == 6
    # the newest version at or before the last checkpoint stays, however old
    s2 = state(**{"checkpoint-round": 5})
    for rnd in (7, 8):
        s2.save(rnd)
    assert sorted(p.name for p in folder.iterdir()) == ["r000005-b.pt", "r000007-b.pt", "r000008-b.pt"]
    # a version that is not what its name says (copied from another client) is refused, not loaded
    (folder / "r000008-b.pt").write_bytes((tmp_path / "run-r1" / "client-7" / "r000007-b.pt").read_bytes())
    with pytest.raises(ClientStateError, match="is not this client's state of that round"):
        state()
    (folder / "r000008-b.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ClientStateError, match="cannot read its client state: .*r000008-b.pt is not a safe"):
        state()
    # memory that holds state is the truth: no file is read
    rd = RecordDict()
    ClientState(rd, 7).put_config("k", {"x": 1})
    assert state(rd).loaded is None and state(rd).get_config("k") == {"x": 1}
