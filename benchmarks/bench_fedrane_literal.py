"""FedRANE as its paper writes it (``method = fedrane`` since issue 40) against our repairs (``fedrane-repaired``,
the defaults before) and FedAvg, on a small federation: does the literal method train here? (issue 40)

    OMP_NUM_THREADS=1 python -m benchmarks.bench_fedrane_literal [--rounds 8] [--clients 10] [--seed 0]

digits, Dirichlet(0.5), ``--clients`` clients, ConvNet, every client every round, E = 2, B = 32, SGD lr 0.1 without
momentum or weight decay (the local training of experiments/configs/fedrane-digits-dir05.toml), 25 % local test
split, in-process (tests/fakegrid.py, the real ClientApp and round driver); also the literal method with one
repair at a time (residual, inductive evaluation, linear predictor). Per arm and round: G-FL accuracy and loss,
P-FL accuracy. One seed: a first look, not a claim (the ledger's rows are tuned and run on 10 seeds).

Writes benchmarks/results/fedrane_literal.json (with the load average: this box is shared). ``--report`` prints
its table instead of measuring.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.harness import loadavg, machine, parser, print_report, write_result  # noqa: E402

NAME = "fedrane_literal"
# label -> (method, overrides): the literal method, our repairs, and the literal method with one repair each
ARMS = {"fedavg": ("fedavg", {}), "fedrane": ("fedrane", {}), "fedrane-repaired": ("fedrane-repaired", {}),
        "fedrane + residual": ("fedrane", {"fedrane.lra-residual": True}),
        "fedrane + inductive eval": ("fedrane", {"fedrane.lra-eval": "inductive"}),
        "fedrane + linear predictor": ("fedrane", {"fedrane.lra-predictor": "linear"})}


def job(method: str, clients: int, rounds: int, seed: int, out_dir: Path) -> dict[str, Any]:
    return {"method": method, "dataset": "digits", "model": "convnet", "partition": "dirichlet",
            "dirichlet-alpha": 0.5, "num-server-rounds": rounds, "fraction-train": 1.0, "local-epochs": 2,
            "batch-size": 32, "lr": 0.1, "momentum": 0.0, "weight-decay": 0.0, "local-test-fraction": 0.25,
            "federated-eval-every": 0, "seed": seed, "checkpoint": False, "out-dir": str(out_dir)}


def run(method: str, over: dict[str, Any], clients: int, rounds: int, seed: int) -> dict[str, Any]:
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        run_federation(FakeGrid(clients), RunConfig.from_dict(resolve_run_config(
            {**job(method, clients, rounds, seed, Path(tmp) / "run"), **over})))
        doc = json.loads((Path(tmp) / "run" / "results.json").read_text())
    return {"cpu_s": time.process_time() - t0,
            "rounds": [{k: row.get(k) for k in ("round", "global_accuracy", "global_loss", "local_accuracy")}
                       for row in doc["rounds"]]}


def render(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [f"Measured {res['written']} (`benchmarks/results/{NAME}.json`): digits, Dirichlet(0.5), {a['clients']} "
             f"clients, ConvNet, E = 2, B = 32, lr 0.1, seed {a['seed']}, {a['rounds']} rounds, in-process; load "
             f"average {res['load_start'][0]:.1f} at the start and {res['load_end'][0]:.1f} at the end.", "",
             "| method | " + " | ".join(f"G-FL r{r['round']}" for r in next(iter(res["runs"].values()))["rounds"])
             + " | final G-FL loss | final P-FL |",
             "|---|" + "---|" * (len(next(iter(res["runs"].values()))["rounds"]) + 2)]
    for method, r in res["runs"].items():
        accs = " | ".join(f"{row['global_accuracy']:.3f}" for row in r["rounds"])
        last = r["rounds"][-1]
        pfl = "-" if last["local_accuracy"] is None else f"{last['local_accuracy']:.3f}"
        lines.append(f"| {method} | {accs} | {last['global_loss']:.3f} | {pfl} |")
    return "\n".join(lines)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        print_report(NAME, render)
        return
    start = loadavg()
    runs = {label: run(method, over, args.clients, args.rounds, args.seed) for label, (method, over) in ARMS.items()}
    path = write_result(NAME, {"args": vars(args), "machine": machine(), "load_start": start, "load_end": loadavg(),
                               "runs": runs})
    print(f"wrote {path}")
    print_report(NAME, render)


if __name__ == "__main__":
    main()
