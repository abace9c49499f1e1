"""Known-output jobs: one fixed-seed tiny federation per registered method, every run-config key explicit.

``record()`` runs each job through the real round driver and ClientApp (tests/fakegrid.py, in-process) and
writes the SHA-256 of the final global parameters to tests/known_outputs.json together with the complete
run config it used. tests/test_known_outputs.py re-runs the jobs from that file and requires the same digest
bit for bit: a refactor that moves a number fails here unless its commit re-records and says why.

    python -m tests.known_outputs          # re-record (only when a change of numbers is intended)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

KNOWN = Path(__file__).with_name("known_outputs.json")

# the tiny job every method runs (digits, 4 clients, 2 rounds); per-method tweaks keep each mechanism active
COMMON: dict[str, Any] = {"dataset": "digits", "partition": "dirichlet", "dirichlet-alpha": 0.5, "seed": 3,
                          "num-server-rounds": 2, "batch-size": 16, "lr": 0.05, "momentum": 0.5,
                          "weight-decay": 1e-4, "local-epochs": 1, "max-local-steps": 4, "model": "mlp",
                          "fraction-train": 1.0, "federated-eval-every": 1, "checkpoint": False,
                          "local-test-fraction": 0.25}  # the split every job was recorded with (P-FL metrics)
NUM_NODES = 4
# job name -> overrides (the job's method is its name unless "method" is given); tweaks keep mechanisms active
PER_JOB: dict[str, dict[str, Any]] = {
    "fedrane": {"model": "convnet"},  # FedRANE's defaults: inductive evaluation, row-mean graph cut
    "fedrane-no-gne": {"model": "convnet", "fedrane.lra-topk": 3, "fedrane.lra-cut": "none",
                       "fedrane.lra-eval": "transductive"},  # the options: top-k graph, transductive evaluation
    "fedrane-newton": {"method": "fedrane-no-lra", "fedrane.gne-solver": "newton", "fedrane.gne-scale": "fedavg-norm"},
    "fedbc": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbc-finetune": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "per-fedbc": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbc-uniform": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbr": {"fedbr.max-momentum": 0.5},  # the max step with the run's momentum, as before issue 19
    # fedufo: the schedule and ranking before issue 19 (still options); fedufo-paper: the defaults since
    "fedufo": {"fedufo.num-clients": NUM_NODES, "fedufo.stage-one-fraction": 0.5, "fedufo.disc-schedule": "alternating",
               "fedufo.sampling-metric": "global-model-local-accuracy"},
    "fedufo-paper": {"method": "fedufo", "fedufo.num-clients": NUM_NODES, "fedufo.stage-one-fraction": 0.5},
    # fedetf: the weightings before issue 19 (still options); fedgmv: Alg. 1's defaults (mu over |S_t|, uniform)
    "fedetf": {"fedetf.warmup-fraction": 0.4, "fedetf.gmv-weighting": "clients", "fedetf.aggregation": "samples"},
    "fedgmv": {"fedetf.warmup-fraction": 0.4},
    "scaffold-etf-head": {"method": "scaffold", "head": "etf"},
    "scaffold-option-i": {"method": "scaffold", "scaffold.option": "I"},
    "fednova": {"max-local-steps": 0},  # unequal local step counts, else FedNova is FedAvg
}
# per-round metrics that enter the digest next to the final parameters (P-FL and fairness included, so a
# change in evaluation or personalisation, e.g. FedBC-FineTune's fine-tuning, is caught too)
METRICS = ("global_accuracy", "global_loss", "local_accuracy", "client_accuracy_mean", "client_accuracy_worst")


def params_digest(params: dict[str, np.ndarray]) -> str:
    """SHA-256 over the parameters in name order (name, dtype, shape and raw bytes of each tensor)."""
    h = hashlib.sha256()
    for name in sorted(params):
        arr = np.ascontiguousarray(params[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def run_job(run_config: dict[str, Any], out_dir: Path) -> str:
    """Run one job from a complete run config; return the digest of its final global parameters and metrics."""
    import torch

    from flcore.config import RunConfig
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict({**run_config, "out-dir": str(out_dir)})
    doc = run_federation(FakeGrid(NUM_NODES), cfg)
    final = torch.load(out_dir / "final_model.pt")
    metrics = [[repr(row.get(k)) for k in METRICS] for row in doc["rounds"]]
    return params_digest({k: v.numpy() for k, v in final.items()}) + ":" + hashlib.sha256(
        json.dumps(metrics).encode()).hexdigest()[:16]


def record(methods: list[str] | None = None) -> None:
    import tempfile

    from flcore.config import resolve_run_config
    from flcore.registry import methods as registered

    data = json.loads(KNOWN.read_text()) if KNOWN.exists() else {}
    for name in methods or sorted(set(registered()) | set(PER_JOB)):
        values = resolve_run_config({**COMMON, "method": name, **PER_JOB.get(name, {})})
        values.pop("out-dir")
        with tempfile.TemporaryDirectory() as tmp:
            digest = run_job(values, Path(tmp) / "run")
        data[name] = {"run_config": values, "sha256": digest}
        print(name, digest, flush=True)
    KNOWN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(sys.argv[1:] or None)
