"""Same seed, same numbers: the in-process engine sequentially, with 2 and 3 worker processes, and Flower's
Ray engine give bit-identical models and metrics (SCAFFOLD: client state in context.state; half the
clients sampled per round, so state must follow each client across rounds and workers)."""

from __future__ import annotations

import json

import pytest
import torch

from engines.local import run_local

JOB = {"method": "scaffold", "dataset": "digits", "num-server-rounds": 3, "fraction-train": 0.5,
       "batch-size": 16, "lr": 0.1, "local-epochs": 1, "seed": 7, "federated-eval-every": 1, "checkpoint": False,
       "local-test-fraction": 0.25}
NODES = 6
COMPARED = ("round", "sampled", "global_accuracy", "global_loss", "local_accuracy", "local_accuracy_worst",
            "client_accuracy_mean", "per_client", "bytes_sent", "bytes_received", "strategy", "num_updates")


def _run(tmp_path, name: str, **kwargs) -> tuple[dict, dict]:
    out = tmp_path / name
    doc = run_local({**JOB, "out-dir": str(out)}, NODES, **kwargs)
    final = torch.load(out / "final_model.pt")
    return doc, final


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> tuple[dict, dict]:
    """The reference: the in-process engine, sequentially (one run for every comparison of this module)."""
    return _run(tmp_path_factory.mktemp("reference"), "seq", engine="inprocess", workers=1)


def _same(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (doc_a, final_a), (doc_b, final_b) = a, b
    assert list(final_a) == list(final_b)
    for key in final_a:
        assert torch.equal(final_a[key], final_b[key]), key
    assert len(doc_a["rounds"]) == len(doc_b["rounds"]) == JOB["num-server-rounds"]
    for ra, rb in zip(doc_a["rounds"], doc_b["rounds"]):
        for key in COMPARED:
            assert ra[key] == rb[key], (ra["round"], key, ra[key], rb[key])
        assert not ra["failures"] and not rb["failures"]


def test_sequential_and_worker_pools_give_identical_numbers(tmp_path, sequential):
    seq = sequential
    doc = seq[0]
    assert doc["run_config"]["engine"] == "inprocess" and doc["run_config"]["engine-workers"] == 1
    # the job really exercises per-client state: each round samples 3 of 6 clients, SCAFFOLD's c grows
    assert all(r["num_updates"] == 3 for r in doc["rounds"])
    assert len({tuple(r["sampled"]) for r in doc["rounds"]}) > 1
    assert all(r["strategy"]["scaffold-c-norm"] > 0 for r in doc["rounds"])
    assert doc["final"]["global_accuracy"] > 0.5
    two = _run(tmp_path, "w2", workers=2)
    assert two[0]["run_config"]["engine-workers"] == 2
    _same(seq, two)
    _same(seq, _run(tmp_path, "w3", workers=3))


@pytest.mark.slow
def test_ray_engine_gives_the_same_numbers_as_the_inprocess_engine(tmp_path, sequential):
    """Also the suite's SCAFFOLD-in-Flower's-simulation check and its check of the files and federated evaluation
    of a run on Ray (each was a Ray run of its own; the latter, `noniid-fl run --engine ray` in
    tests/test_simulation.py: the command line's Ray path is run by tests/test_reliability_ray.py, to exit codes
    0, 1 and 143): on Ray, client state (c_i in context.state) follows each client across rounds although only
    half of them train in a round, and SCAFFOLD's protocol holds (c out with every model, delta c_i back with
    every update)."""
    out = tmp_path / "ray"
    # checkpoint on here only: it writes checkpoint.pt and changes no number
    doc = run_local({**JOB, "checkpoint": True, "out-dir": str(out)}, NODES, engine="ray")
    for name in ("results.json", "metrics.csv", "accuracy.png", "final_model.pt", "checkpoint.pt"):
        assert (out / name).exists(), name
    assert json.loads((out / "results.json").read_text()) == doc
    assert doc["run_config"]["engine"] == "ray" and doc["run_config"]["method"] == "scaffold"
    rounds = doc["rounds"]
    assert [r["num_updates"] for r in rounds] == [3, 3, 3] and len({tuple(r["sampled"]) for r in rounds}) > 1
    assert all(r["strategy"]["scaffold-c-norm"] > 0 for r in rounds)
    assert doc["final"]["global_accuracy"] > 0.5 and rounds[-1]["global_loss"] < rounds[0]["global_loss"]
    # both directions carry two models' worth (all parameters are trainable here): the byte counts match
    assert all(r["bytes_sent"] == r["bytes_received"] > 0 for r in rounds)
    for r in rounds:  # federated evaluation on Ray: every client's local test split
        assert 0 <= r["local_accuracy_worst"] <= r["local_accuracy"] <= r["local_accuracy_best"] <= 1
        assert r["min_data_client_accuracy"] is not None and len(r["per_client"]) == NODES
    _same(sequential, (doc, torch.load(out / "final_model.pt")))


def test_a_run_resumed_on_another_engine_ends_where_an_uninterrupted_one_does(tmp_path):
    """FedAvg (client state would be lost with the Contexts on resume): 2 rounds on 2 workers, resumed to 3
    on the sequential engine, equals 3 rounds straight."""
    job = {**JOB, "method": "fedavg", "fraction-train": 1.0, "federated-eval-every": 0, "checkpoint": True}
    straight = run_local({**job, "out-dir": str(tmp_path / "straight")}, NODES, workers=1)
    run_local({**job, "num-server-rounds": 2, "out-dir": str(tmp_path / "part")}, NODES, workers=2)
    resumed = run_local({**job, "resume-from": str(tmp_path / "part"), "out-dir": str(tmp_path / "part"),
                         "overwrite": True}, NODES, workers=1)
    a, b = torch.load(tmp_path / "straight" / "final_model.pt"), torch.load(tmp_path / "part" / "final_model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["global_loss"] for r in resumed["rounds"]] == [r["global_loss"] for r in straight["rounds"]]
