"""The basic P-FL baselines learn (issue 41): one small offline federation (digits, 10 clients, Dirichlet(0.1),
20 rounds, every client every round, a quarter of each client's data as its local test split), each method
beside FedAvg at the same seed.

P-FL is the mean over the round's clients of their personalized model on their local test split (the mean of
the last 3 rounds); FedAvg's reference is its global model on the same local test splits (the federated
evaluation after the last round), the "FedAvg" of the P-FL tables. Measured on the locked stack (2026-12-01,
this job): FedAvg G-FL 0.936, its global model on the local tests 0.878 (its locally trained models 0.946);
local 0.888; Ditto 0.940; FedPer 0.895; FedBABU 0.902 (its broadcast model before fine-tuning 0.817);
Fed-RoD 0.944 (its generic model on the local tests 0.840, G-FL 0.838). Each margin below is about half the
measured gap or less.
"""

from __future__ import annotations

import pytest

from experiments.simulate import simulate

pytestmark = pytest.mark.slow

JOB = {"dataset": "digits", "partition": "dirichlet", "dirichlet-alpha": 0.1, "seed": 0, "num-server-rounds": 20,
       "batch-size": 16, "lr": 0.05, "momentum": 0.5, "local-epochs": 1, "model": "mlp", "fraction-train": 1.0,
       "federated-eval-every": 20, "checkpoint": False, "local-test-fraction": 0.25}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict[str, dict] = {}

    def get(method: str) -> dict:
        if method not in cache:
            out = tmp_path_factory.mktemp(method)
            cache[method] = simulate({**JOB, "method": method, "out-dir": str(out)}, num_supernodes=10)
        return cache[method]
    return get


def p_fl(doc: dict) -> float:
    return sum(r["local_accuracy"] for r in doc["rounds"][-3:]) / 3


def global_on_local_tests(doc: dict) -> float:
    return doc["rounds"][-1]["client_accuracy_mean"]


def test_local_is_the_floor(runs):
    local, fedavg = runs("local"), runs("fedavg")
    g = [r["global_accuracy"] for r in local["rounds"]]
    assert len(set(g)) == 1 and g[0] < 0.2                 # the server's model is the initial one
    assert 0.85 <= p_fl(local) < p_fl(fedavg)                # each client alone learns, below FedAvg + local steps


def test_ditto(runs):
    ditto, fedavg, local = runs("ditto"), runs("fedavg"), runs("local")
    assert [r["global_accuracy"] for r in ditto["rounds"]] == [r["global_accuracy"] for r in fedavg["rounds"]]
    assert p_fl(ditto) >= global_on_local_tests(fedavg) + 0.04   # measured +0.063
    assert p_fl(ditto) >= p_fl(local) + 0.03                     # measured +0.053: v_k gains from the federation


def test_fedper(runs):
    fedper, fedavg = runs("fedper"), runs("fedavg")
    assert p_fl(fedper) >= global_on_local_tests(fedavg) + 0.01  # measured +0.017


def test_fedbabu(runs):
    babu, fedavg = runs("fedbabu"), runs("fedavg")
    assert p_fl(babu) >= global_on_local_tests(babu) + 0.05      # the fine-tuning: measured +0.085
    assert p_fl(babu) >= global_on_local_tests(fedavg) + 0.01    # measured +0.024
    assert babu["rounds"][-1]["global_accuracy"] > 0.8           # a frozen random head, a learned body: 0.883


def test_fedrod(runs):
    rod, fedavg = runs("fedrod"), runs("fedavg")
    assert p_fl(rod) >= global_on_local_tests(fedavg) + 0.04     # measured +0.066
    assert p_fl(rod) >= global_on_local_tests(rod) + 0.05        # the personal head: measured +0.10
    # the generic model learns (G-FL 0.838), but below FedAvg's 0.936 in this short job: Fed-RoD's G-FL claim
    # (FedRANE Table 1) is not reproduced here
    assert rod["rounds"][-1]["global_accuracy"] > 0.75
