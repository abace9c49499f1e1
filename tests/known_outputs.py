"""Known-output jobs: one fixed-seed tiny federation per registered method, every run-config key explicit.

``record()`` runs each job through the real round driver and ClientApp (tests/fakegrid.py, in-process) and
writes to tests/known_outputs.json, per job: the complete run config, the SHA-256 of the final global
parameters and per-round metrics (``sha256``), and a numeric fingerprint of the same (``sketch``: per
tensor its norm and a fixed random projection; ``metrics``: the per-round values). The file also records the
stack the digests belong to (``stack``: the lock's digest, Python, machine and torch's CPU kernel level).

tests/test_known_outputs.py re-runs every job:
- on the recorded stack (the installed stack is exactly requirements.lock, same lock, same Python, machine
  and CPU kernel level) it requires the digest bit for bit: a refactor that moves a number fails unless its
  commit re-records and says why;
- on any other stack (a newer torch, another BLAS kernel) it compares the fingerprint within TOLERANCE,
  which separates another kernel's rounding from a change of the math (see TOLERANCE for the measurements).

    python -m tests.known_outputs [JOB ...]   # re-record (only on the locked stack; only for an intended change)
"""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from dataclasses import dataclass
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
    "fedrane": {"model": "convnet"},  # the paper's defaults (issue 40): complete graph, no residual, mlp predictor
    "fedrane-repaired": {"model": "convnet"},  # the fedrane defaults before issue 40: fedrane's old digest exactly
    "fedrane-code": {"model": "convnet"},  # the authors' CNNModel extractor (flat-features), kept optimizer, StepLR
    "fedrane-no-gne": {"model": "convnet", "fedrane.lra-topk": 3, "fedrane.lra-cut": "none",
                       "fedrane.lra-eval": "transductive"},  # the options: top-k graph, transductive evaluation
    "fedrane-newton": {"method": "fedrane-no-lra", "fedrane.gne-solver": "newton", "fedrane.gne-scale": "fedavg-norm"},
    "fedbc": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbc-finetune": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "per-fedbc": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbc-uniform": {"fedbc.lambda-init": 0.05, "fedbc.eta-lambda": 0.1},
    "fedbc-code": {"fedbc-code.lambda-init": 0.05, "fedbc-code.eta-lambda": 0.1},  # the code's one dual optimizer
    "fedbr": {"fedbr.max-momentum": 0.5},  # the max step with the run's momentum, as before issue 19
    # issue 40: Mixture over a proxy DATASET (mnist-5k images area-averaged to digits' 8x8), the authors' code
    # (its MNIST CNN, plain SGD, partners from the batch, phi_g cached per round) and its one shared RSM set
    "fedbr-proxy-mnist": {"method": "fedbr", "fedbr.proxy-dataset": "mnist-5k"},
    "fedbr-code": {"model": "domainbed-cnn", "momentum": 0.0},
    "fedbr-code-rsm": {"method": "fedbr-code", "model": "domainbed-cnn", "momentum": 0.0, "fedbr-code.pseudo": "rsm"},
    # fedufo: the schedule and ranking before issue 19 (still options); fedufo-paper: the defaults since
    "fedufo": {"fedufo.num-clients": NUM_NODES, "fedufo.stage-one-fraction": 0.5, "fedufo.disc-schedule": "alternating",
               "fedufo.sampling-metric": "global-model-local-accuracy"},
    "fedufo-paper": {"method": "fedufo", "fedufo.num-clients": NUM_NODES, "fedufo.stage-one-fraction": 0.5},
    # fedetf: the weightings before issue 19 and the final-model features before issue 40 (still options);
    # fedgmv: Alg. 1's defaults (mu over |S_t| of the training-time features, uniform averaging)
    "fedetf": {"fedetf.warmup-fraction": 0.4, "fedetf.gmv-weighting": "clients", "fedetf.aggregation": "samples",
               "fedetf.gmv-features": "final"},
    "fedgmv": {"fedetf.warmup-fraction": 0.4},
    # feddecorr: the default since issue 40 (the authors' loss.py form, beta 0.1); feddecorr-code: its recipe's
    # values written out (COMMON's lr, momentum, B, E would win over the recipe), local steps capped by COMMON
    # feddecorr: the code form standardises each feature by sqrt(var + eps); at the authors' eps = 1e-8 a feature the
    # tiny MLP leaves (almost) dead amplifies rounding, so the job drifted 1.3% between AVX2 and AVX-512 kernels;
    # eps = 1e-4 keeps the mechanism (the job still differs from FedAvg's) and the cross-kernel check meaningful
    "feddecorr": {"feddecorr.eps": 1e-4},
    "feddecorr-code": {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "local-epochs": 10, "batch-size": 64},
    "scaffold-etf-head": {"method": "scaffold", "head": "etf"},
    "scaffold-option-i": {"method": "scaffold", "scaffold.option": "I"},
    "fednova": {"max-local-steps": 0},  # unequal local step counts, else FedNova is FedAvg
    "ditto": {"max-local-steps": 0},  # Ditto's global model is FedAvg's by design (its v_k is P-FL only): whole epochs
    # our own partitioners, kept where flwr-datasets has no equivalent (data_partitioning/flower.py): their
    # digests do not move when iid / dirichlet / shards go through flwr-datasets (issue 33)
    "fedavg-classes": {"method": "fedavg", "partition": "classes", "classes-per-client": 2, "samples-per-class": 20},
    "fedavg-power-law": {"method": "fedavg", "partition": "power-law"},
    # pFedMe and Per-FedAvg take plain gradient steps (their check_run refuses COMMON's momentum 0.5)
    "pfedme": {"momentum": 0.0},
    "perfedavg": {"momentum": 0.0},
    "perfedavg-hf": {"method": "perfedavg", "momentum": 0.0, "perfedavg.variant": "hf"},
    # FedRS's restriction composed with SCAFFOLD (the neural-collapse paper's SCAFFOLD/RS row)
    "scaffold-rs": {"method": "scaffold", "restricted-softmax-alpha": 0.5},
}
# per-round metrics that enter the digest next to the final parameters (P-FL and fairness included, so a
# change in evaluation or personalisation, e.g. FedBC-FineTune's fine-tuning, is caught too)
METRICS = ("global_accuracy", "global_loss", "local_accuracy", "client_accuracy_mean", "client_accuracy_worst")


# Tolerances of the cross-stack check (measured, see TOLERANCE_EVIDENCE): a tensor's relative distance
# ||P(x - x_ref)|| / ||P x_ref|| under a fixed random projection P, and per-round metrics.
TOLERANCE = {"tensor": 1e-3, "accuracy": 0.01, "loss": 1e-4}
TOLERANCE_EVIDENCE = """Measured 2026-11-27 (benchmarks/results/known_outputs_drift.json, `python -m tests.known_outputs
--fingerprint` on each stack, then `--drift`), all 24 jobs:
- torch 2.15.0 vs the lock's 2.14.1 on one machine (AMD EPYC, AVX2): bit-identical, every job. The digests
  recorded before the lock (another machine) differed for every job on both: what moves the bits is the CPU's
  kernel level (torch's AVX2/AVX512 code paths, MKL's), not the torch release.
- other CPU kernels on this machine (ATEN_CPU_CAPABILITY=default; MKL_CBWR=COMPATIBLE): largest tensor distance
  5.6e-5 (fedufo; every other job below 2e-7), accuracies identical, losses within 1.5e-7 relative.
- a one-line change of the math (FedAvg averaging uniformly instead of by sample counts; the test below):
  every tensor moves, the least by 2.5e-3 and the most by 0.24, accuracies by up to 0.125.
So the tensor tolerance sits 18x above the largest measured drift and 2.5x below the smallest tensor move of
that change; accuracy 0.01 is 3 test images of 360 (none flipped under any kernel); the loss tolerance is 650x
the measured drift. A change smaller than the tolerance (a tiny proximal coefficient, say) is caught only by
the bit-exact check on the recorded stack, which CI runs."""
SKETCH_DIM = 16  # rows of each tensor's projection (JL: the distance estimate is within ~+-35 % at 16 rows)


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


@functools.lru_cache(maxsize=128)
def _projection(name: str, size: int) -> np.ndarray:
    """The fixed projection of tensor ``name`` (drawn once per process: the jobs share their models' tensors)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    proj = rng.standard_normal((SKETCH_DIM, size)) / np.sqrt(SKETCH_DIM)
    proj.setflags(write=False)
    return proj


def sketch(params: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Per floating tensor: [norm, P x ...] in float64, P a fixed Gaussian projection seeded by the name.
    Integer buffers (batch-norm counters) are kept whole: they are exact on every stack."""
    out = {}
    for name in sorted(params):
        x = np.asarray(params[name])
        if not np.issubdtype(x.dtype, np.floating):
            out[name] = [float(v) for v in x.ravel()]
            continue
        flat = x.astype(np.float64).ravel()
        out[name] = [float(np.linalg.norm(flat))] + [float(v) for v in _projection(name, flat.size) @ flat]
    return out


def compare_sketch(ref: dict[str, list[float]], got: dict[str, list[float]], tol: float) -> list[str]:
    """Tensors whose projected relative distance exceeds ``tol`` (or that appeared, vanished, changed size)."""
    problems = [f"tensor {n}: missing" for n in sorted(set(ref) - set(got))]
    problems += [f"tensor {n}: not recorded" for n in sorted(set(got) - set(ref))]
    for name in sorted(set(ref) & set(got)):
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        if a.shape != b.shape:
            problems.append(f"tensor {name}: {b.size} sketch values, recorded {a.size}")
            continue
        scale = max(float(np.linalg.norm(a)), 1e-12)
        dist = float(np.linalg.norm(a - b)) / scale
        if not dist <= tol:
            problems.append(f"tensor {name}: relative distance {dist:.3g} > {tol:g}")
    return problems


def compare_metrics(ref: list[list[Any]], got: list[list[Any]], tol: dict[str, float]) -> list[str]:
    """Per round and metric: accuracies within tol['accuracy'] (absolute), losses within tol['loss'] (relative);
    a metric present on one side only is a difference."""
    if len(ref) != len(got):
        return [f"{len(got)} rounds, recorded {len(ref)}"]
    problems = []
    for rnd, (rrow, grow) in enumerate(zip(ref, got), 1):
        for key, a, b in zip(METRICS, rrow, grow):
            if a is None or b is None:
                if (a is None) != (b is None):
                    problems.append(f"round {rnd} {key}: {b!r}, recorded {a!r}")
                continue
            if key.endswith("loss"):
                bad = not abs(b - a) <= tol["loss"] * max(abs(a), 1e-12)
            else:
                bad = not abs(b - a) <= tol["accuracy"]
            if bad:
                problems.append(f"round {rnd} {key}: {b:.6g}, recorded {a:.6g}")
    return problems


@dataclass
class JobOutput:
    digest: str
    sketch: dict[str, list[float]]
    metrics: list[list[Any]]


def run_job(run_config: dict[str, Any], out_dir: Path) -> JobOutput:
    """Run one job from a complete run config: the digest of its final global parameters and metrics, and
    their fingerprint."""
    import torch

    from flcore.config import RunConfig
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict({**run_config, "out-dir": str(out_dir)})
    doc = run_federation(FakeGrid(NUM_NODES), cfg)
    final = {k: v.numpy() for k, v in torch.load(out_dir / "final_model.pt").items()}
    values = [[row.get(k) for k in METRICS] for row in doc["rounds"]]
    reprs = [[repr(v) for v in row] for row in values]
    digest = params_digest(final) + ":" + hashlib.sha256(json.dumps(reprs).encode()).hexdigest()[:16]
    return JobOutput(digest, sketch(final), values)


@functools.lru_cache(maxsize=1)
def stack_key() -> dict[str, Any]:
    """What a bit-exact digest depends on: the whole locked stack, Python, machine and torch's CPU kernels. Read
    once per process (listing the installed distributions takes 0.1 s, and every job's check asks)."""
    import platform

    import torch

    from flcore.stack import installed_versions, lock_differences, lock_digest, read_lock

    locked = read_lock()
    return {"lock": lock_digest(locked) if not lock_differences(locked, installed_versions()) else None,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def exact_mode(recorded: dict[str, Any]) -> tuple[bool, str]:
    """Whether this stack is the one the digests were recorded on, and if not, why."""
    here = stack_key()
    if here["lock"] is None:
        return False, "the installed stack is not requirements.lock (`python -m flcore.stack --check`)"
    diffs = [f"{k} {here[k]} (recorded {recorded.get(k)})" for k in here if here[k] != recorded.get(k)]
    return (not diffs), ("; ".join(diffs) or "the recorded stack")


KERNEL_ENV = {"AVX2": "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"}


def kernel_hint(recorded: dict[str, Any], here: dict[str, Any]) -> str:
    """Where only the CPU kernel level differs and this CPU can take the recorded level's code paths: the
    environment that makes it do so (docs/ADDING_A_METHOD.md, step 4), so one job can be recorded alone."""
    rest = {k for k in here if here[k] != recorded.get(k)} - {"cpu_capability"}
    env = KERNEL_ENV.get(str(recorded.get("cpu_capability")))
    if rest or env is None:
        return ""
    return (f"; or, since only the CPU kernel level differs, try `{env}`: torch, oneDNN and MKL then take their "
            f"{recorded.get('cpu_capability')} code paths, which reproduced every recorded job bit for bit on an "
            "AVX-512 AMD EPYC but none on an Intel Xeon (MKL's paths differ by vendor); a job recorded alone here "
            "keeps its own stack either way")


def load() -> dict[str, Any]:
    return json.loads(KNOWN.read_text()) if KNOWN.exists() else {"stack": {}, "jobs": {}}


def record(methods: list[str] | None = None) -> None:
    import tempfile

    from flcore.config import resolve_run_config
    from flcore.registry import methods as registered

    here = stack_key()
    if here["lock"] is None:
        raise SystemExit("known outputs are recorded on the locked stack only; the installed stack differs from "
                         "requirements.lock (`python -m flcore.stack --check` lists how)")
    data = load()
    names = methods or sorted(set(registered()) | set(PER_JOB))
    # the whole file on this stack, or some jobs recorded on another CPU (kernel level, vendor, Python) than the
    # rest: those keep their own stack, bit-exact where they were recorded and within tolerance elsewhere, so a
    # contributor on any CPU can add a job without re-recording the others (issue 39)
    whole = not data["jobs"] or data["stack"] == here or set(names) >= set(data["jobs"])
    for name in names:
        values = resolve_run_config({**COMMON, "method": name, **PER_JOB.get(name, {})})
        values.pop("out-dir")
        with tempfile.TemporaryDirectory() as tmp:
            out = run_job(values, Path(tmp) / "run")
        data["jobs"][name] = {"run_config": values, "sha256": out.digest, "sketch": out.sketch,
                              "metrics": out.metrics, **({} if whole else {"stack": here})}
        print(name, out.digest + ("" if whole else f" (its own stack: {here})"), flush=True)
    if whole:
        data["stack"] = here
    KNOWN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def job_stack(data: dict[str, Any], name: str) -> dict[str, Any]:
    """The stack job ``name`` was recorded on: its own, if it was recorded apart from the others, else the file's."""
    return data["jobs"][name].get("stack", data["stack"])


def fingerprint_all(path: Path, jobs: list[str] | None = None) -> None:
    """Run the recorded jobs on whatever stack is installed and write their fingerprints (no recording): one
    side of a cross-stack drift measurement."""
    import tempfile

    from flcore.stack import stack_info

    data = load()
    out: dict[str, Any] = {"stack": stack_info(), "jobs": {}}
    for name in jobs or sorted(data["jobs"]):
        with tempfile.TemporaryDirectory() as tmp:
            res = run_job(data["jobs"][name]["run_config"], Path(tmp) / "run")
        out["jobs"][name] = {"sha256": res.digest, "sketch": res.sketch, "metrics": res.metrics}
        print(name, res.digest, flush=True)
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def drift(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per job shared by two fingerprint files: the largest tensor distance and metric differences."""
    out = {}
    for job in sorted(set(a["jobs"]) & set(b["jobs"])):
        ra, rb = a["jobs"][job], b["jobs"][job]
        tensor = max(float(np.linalg.norm(np.subtract(ra["sketch"][n], rb["sketch"][n])))
                     / max(float(np.linalg.norm(ra["sketch"][n])), 1e-12) for n in ra["sketch"])
        acc = loss = 0.0
        for row_a, row_b in zip(ra["metrics"], rb["metrics"]):
            for key, x, y in zip(METRICS, row_a, row_b):
                if x is None or y is None:
                    continue
                if key.endswith("loss"):
                    loss = max(loss, abs(x - y) / max(abs(x), 1e-12))
                else:
                    acc = max(acc, abs(x - y))
        out[job] = {"tensor": tensor, "accuracy": acc, "loss": loss, "bit_exact": ra["sha256"] == rb["sha256"]}
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="record known outputs (default), or measure cross-stack drift")
    ap.add_argument("jobs", nargs="*")
    ap.add_argument("--fingerprint", type=Path, help="write this stack's fingerprints of the recorded jobs here")
    ap.add_argument("--drift", nargs=2, type=Path, metavar=("A", "B"), help="compare two fingerprint files")
    args = ap.parse_args()
    if args.fingerprint:
        fingerprint_all(args.fingerprint, args.jobs or None)
    elif args.drift:
        result = drift(*(json.loads(p.read_text()) for p in args.drift))
        for job, row in result.items():
            print(f"{job:20s} tensor {row['tensor']:.3g} accuracy {row['accuracy']:.3g} loss {row['loss']:.3g} "
                  f"bit-exact {row['bit_exact']}")
        print("max", {k: max(r[k] for r in result.values()) for k in ("tensor", "accuracy", "loss")})
    else:
        record(args.jobs or None)
