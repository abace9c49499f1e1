"""FedUFO on the issue-19 job: which variant learns with the paper's optimizer, and each mechanism per round.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_fedufo [--rounds 40] [VARIANT ...]   # runs, merges the file
    python -m benchmarks.bench_fedufo --report                                        # markdown from the file

The job (issue 19): mnist-5k, McMahan shards (2 per client), 20 clients, 5 per round, E = 2, B = 10, SGD
lr 0.01, momentum 0.9, weight decay 2e-4 (FedUFO Sec. 4.1's optimizer), no local test split, in-process
engine, seed 0. Variants: FedAvg; FedUFO at its defaults (paper schedule: the model for the round, then the
discriminator; Eq. 7 as printed); the per-step alternation (the schedule before issue 19); the renormalised
CGR target; and the default K = 100 discriminator outputs on these 20 clients. Each variant's per-round
G-FL accuracy/loss and the method's per-round metrics (uniform loss, D's accuracy on own features, CE,
CGR target max-probability / entropy, CGR and CGL losses) go to benchmarks/results/fedufo.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.harness import load_result, machine, write_result  # noqa: E402

NAME = "fedufo"
JOB: dict[str, Any] = {"dataset": "mnist-5k", "partition": "shards", "shards-per-client": 2, "fraction-train": 0.25,
                       "local-epochs": 2, "batch-size": 10, "lr": 0.01, "momentum": 0.9, "weight-decay": 2e-4,
                       "local-test-fraction": 0.0, "federated-eval-every": 0, "checkpoint": False, "seed": 0}
NODES = 20
VARIANTS: dict[str, dict[str, Any]] = {
    "fedavg": {"method": "fedavg"},
    "fedufo": {"method": "fedufo", "fedufo.num-clients": NODES},
    "fedufo-alternating": {"method": "fedufo", "fedufo.num-clients": NODES, "fedufo.disc-schedule": "alternating"},
    "fedufo-normalize": {"method": "fedufo", "fedufo.num-clients": NODES, "fedufo.cgr-target": "normalize"},
    "fedufo-k100": {"method": "fedufo", "fedufo.num-clients": 100},
}
SERIES = ("uniform-loss", "ce-loss", "disc-own-accuracy", "cgr-target-max-prob", "cgr-target-entropy", "cgr-loss",
          "cgl-loss", "global-model-train-accuracy")


def run_variant(name: str, rounds: int, out_root: str) -> dict[str, Any]:
    from experiments.simulate import simulate

    over = {**JOB, **VARIANTS[name], "num-server-rounds": rounds, "out-dir": f"{out_root}/{name}", "overwrite": True}
    t0 = time.time()
    load = os.getloadavg()[0]
    doc = simulate(over, num_supernodes=NODES)
    rows = []
    for r in doc["rounds"]:
        s = r.get("strategy") or {}
        rows.append({"round": r["round"], "accuracy": r["global_accuracy"], "loss": r["global_loss"],
                     "stage": s.get("fedufo-stage"),
                     **{k: s[f"mean-fedufo-{k}"] for k in SERIES if f"mean-fedufo-{k}" in s}})
    acc = [row["accuracy"] for row in rows]
    return {"overrides": VARIANTS[name], "rounds": rows, "final_accuracy": acc[-1],
            "mean_last5_accuracy": sum(acc[-5:]) / len(acc[-5:]), "best_accuracy": max(acc),
            "wall_s": time.time() - t0, "loadavg_at_start": load}


def report(data: dict[str, Any]) -> str:
    """Markdown: one line per variant, then the mechanisms of the default FedUFO by stage."""
    out = [f"Job: {data['job_text']}; {data['rounds']} rounds; measured {data['written']} at commit "
           f"{data['commit']} (load {data['machine']['loadavg_at_start'][0]:.1f} at start).", "",
           "| variant | final acc | mean acc, last 5 rounds | best | mean uniform loss (stage 1) | "
           "mean CE (stage 1) | CGR target max-prob (stage 2) |", "|---|---|---|---|---|---|---|"]
    for name, v in data["variants"].items():
        def mean(key: str, stage: int) -> str:
            vals = [r[key] for r in v["rounds"] if r.get("stage") == stage and key in r]
            return f"{sum(vals) / len(vals):.3f}" if vals else "-"
        out.append(f"| {name} | {v['final_accuracy']:.3f} | {v['mean_last5_accuracy']:.3f} | {v['best_accuracy']:.3f} | "
                   f"{mean('uniform-loss', 1)} | {mean('ce-loss', 1)} | {mean('cgr-target-max-prob', 2)} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", help=f"variants to (re)run, of {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out-root", default="/tmp/bench_fedufo")
    ap.add_argument("--report", action="store_true", help="print the markdown table of the result file")
    args = ap.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if args.report:
        data = load_result(NAME)
        if data is None:
            raise SystemExit("no benchmarks/results/fedufo.json yet: run the benchmark first")
        print(report(data))
        return
    data = load_result(NAME) or {}
    if data.get("rounds") not in (None, args.rounds):
        data = {}  # another round count: start over
    variants = dict(data.get("variants", {}))
    for name in args.variants or list(VARIANTS):
        variants[name] = run_variant(name, args.rounds, args.out_root)
        print(f"{name}: final {variants[name]['final_accuracy']:.3f} "
              f"({variants[name]['wall_s']:.0f} s)", flush=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        job_text = (f"mnist-5k, shards x2, {NODES} clients, 5 per round, E=2, B=10, SGD lr 0.01 momentum 0.9 "
                    "wd 2e-4, no local test split, seed 0")
        write_result(NAME, {"machine": machine(), "commit": commit, "job": JOB, "job_text": job_text,
                            "nodes": NODES, "rounds": args.rounds, "variants": variants})


if __name__ == "__main__":
    main()
