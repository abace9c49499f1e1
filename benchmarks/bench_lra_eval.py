"""FedRANE's evaluation modes on digits: what inductive evaluation costs next to transductive, and the mechanism
at work in a default run (issue 19).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_lra_eval [--rounds 10] [--clients 10] [--repeats 3]

1. A FedRANE run with every FedRANE default of before issue 40 (inductive evaluation, row-mean graph cut,
   normalized GNE step; since then method fedrane-repaired, which this benchmark runs) on
   digits, Dirichlet(0.5), ``--clients`` clients, ConvNet, 5 local epochs (the paper's E), in-process (tests/fakegrid.py, the real ClientApp),
   with a 25% local test split so that P-FL graphs are measured too. Per round: G-FL accuracy, the graph
   density of the clients' training graphs, of their P-FL graphs and of the server's G-FL graphs, and the GNE
   weights' spread (max/min weight, total variation from FedAvg's sample fractions, step norm / FedAvg's).
2. On the final global model, the G-FL evaluation of the global test set (the server's support set: a seeded
   sample of the clients' training pool) in each mode: inductive (|S| = batch-size - 1 = 31, and 63),
   transductive with graphs of 512, 128 and 32 test samples, identity. Wall and CPU seconds (median of
   ``--repeats``), accuracy (information only: no default was chosen on it), graph density and size.

Writes benchmarks/results/lra_eval.json (with the load average: this box is shared). ``--report`` prints the
tables of docs/FEDRANE.md from that file instead of measuring.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.harness import loadavg, machine, parser, print_report, write_result  # noqa: E402
from data_partitioning.federated import global_test_set  # noqa: E402
from data_partitioning.support import training_pool_sample  # noqa: E402
from flcore.config import RunConfig, resolve_run_config  # noqa: E402
from models import build_model  # noqa: E402
from models.evaluation import eval_support_size, evaluate, pop_eval_stats, set_eval_support  # noqa: E402

ROUND_KEYS = ("global_accuracy", "global_lra_graph_density", "global_lra_graph_nodes")
STRATEGY_KEYS = ("lra-graph-density-mean", "lra-graph-density-min", "lra-graph-density-max",
                 "lra-eval-graph-density-mean", "gne-weight-min", "gne-weight-max", "gne-weight-ratio",
                 "gne-tv-from-fedavg", "gne-step-norm-ratio", "gne-status")
MODES = {"inductive |S|=31": {"fedrane-repaired.lra-eval": "inductive"},
         "inductive |S|=63": {"fedrane-repaired.lra-eval": "inductive", "fedrane-repaired.lra-support-size": 63},
         "transductive 512": {"fedrane-repaired.lra-eval": "transductive", "fedrane-repaired.lra-eval-batch": 512},
         "transductive 128": {"fedrane-repaired.lra-eval": "transductive", "fedrane-repaired.lra-eval-batch": 128},
         "transductive 32": {"fedrane-repaired.lra-eval": "transductive", "fedrane-repaired.lra-eval-batch": 32},
         "identity": {"fedrane-repaired.lra-eval": "identity"}}


def job(rounds: int, out_dir: Path) -> dict[str, Any]:
    # fedrane-repaired: the fedrane defaults this benchmark measured (before issue 40; lra_eval.json says "fedrane")
    return {"method": "fedrane-repaired", "dataset": "digits", "model": "convnet", "partition": "dirichlet",
            "dirichlet-alpha": 0.5, "num-server-rounds": rounds, "local-epochs": 5, "local-test-fraction": 0.25,
            "federated-eval-every": 0, "checkpoint": False, "out-dir": str(out_dir)}


def run_default(clients: int, rounds: int, tmp: Path) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    values = resolve_run_config(job(rounds, tmp / "run"))
    run_federation(FakeGrid(clients), RunConfig.from_dict(values))
    doc = json.loads((tmp / "run" / "results.json").read_text())
    rows = [{"round": r["round"], "wall_time_s": r["wall_time_s"], **{k: r.get(k) for k in ROUND_KEYS},
             **{k: r["strategy"].get(k) for k in STRATEGY_KEYS}} for r in doc["rounds"]]
    return rows, values, tmp / "run" / "final_model.pt"


def time_modes(values: dict[str, Any], final: Path, clients: int, repeats: int) -> dict[str, Any]:
    state = torch.load(final)
    out: dict[str, Any] = {}
    for name, over in MODES.items():
        cfg = RunConfig.from_dict({**values, **over})
        x, y = (torch.as_tensor(a) for a in global_test_set(cfg, clients))
        model = build_model(cfg, tuple(x.shape[1:]), 10)
        model.load_state_dict(state)
        size = eval_support_size(model)
        if size:
            set_eval_support(model, torch.as_tensor(training_pool_sample(cfg, clients, size)))
        walls, cpus = [], []
        for _ in range(repeats):
            w, c = time.perf_counter(), time.process_time()
            loss, acc = evaluate(model, x, y)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
            stats = pop_eval_stats(model)
        out[name] = {"test_samples": int(x.shape[0]), "wall_s": statistics.median(walls),
                     "cpu_s": statistics.median(cpus), "accuracy": acc, "loss": loss,
                     "graph_density": stats.get("lra_graph_density"), "graph_nodes": stats.get("lra_graph_nodes")}
        print(f"{name:18s} {out[name]['wall_s']:.3f} s wall {out[name]['cpu_s']:.3f} s CPU  acc {acc:.4f}  "
              f"density {out[name]['graph_density']}", flush=True)
    return out


def report(res: dict[str, Any]) -> str:
    """The markdown tables of docs/FEDRANE.md from a lra_eval result."""
    load = res["machine"]["loadavg_at_start"][0], res["loadavg_at_end"][0]
    lines = [f"Measured {res['written']} (`benchmarks/results/lra_eval.json`), 1 torch thread, load average "
             f"{load[0]:.1f} at the start and {load[1]:.1f} at the end on 2 shared cores.", "",
             "| round | G-FL acc | density: train (min-max over clients) | P-FL eval | G-FL eval | GNE max/min "
             "weight | TV from FedAvg | step / FedAvg step |", "|---|---|---|---|---|---|---|---|"]
    for r in res["rounds_measured"]:
        lines.append(f"| {r['round']} | {r['global_accuracy']:.3f} | {r['lra-graph-density-mean']:.3f} "
                     f"({r['lra-graph-density-min']:.3f}-{r['lra-graph-density-max']:.3f}) | "
                     f"{r['lra-eval-graph-density-mean']:.3f} | {r['global_lra_graph_density']:.3f} | "
                     f"{r['gne-weight-ratio']:.2f} | {r['gne-tv-from-fedavg']:.3f} | {r['gne-step-norm-ratio']:.3f} |")
    n = next(iter(res["eval_modes"].values()))["test_samples"]
    lines += ["", f"G-FL evaluation of the final model on the {n} test images, per mode (median of the repeats):", "",
              "| mode | graph size | density | CPU s | wall s | accuracy (information only) |", "|---|---|---|---|---|---|"]
    for name, m in res["eval_modes"].items():
        size = "-" if m["graph_nodes"] is None else f"{m['graph_nodes']:.1f}"
        dens = "-" if m["graph_density"] is None else f"{m['graph_density']:.3f}"
        lines.append(f"| {name.replace('|', chr(92) + '|')} | {size} | {dens} | {m['cpu_s']:.3f} | {m['wall_s']:.3f} | {m['accuracy']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--report", action="store_true", help="print docs/FEDRANE.md's tables from the result file")
    args = ap.parse_args()
    if args.report:
        print_report("lra_eval", report)
        return
    torch.set_num_threads(1)
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rows, values, final = run_default(args.clients, args.rounds, Path(tmp))
        run_s = time.perf_counter() - t0
        modes = time_modes(values, final, args.clients, args.repeats)
    values.pop("out-dir", None)
    path = write_result("lra_eval", {
        "machine": info, "loadavg_at_end": loadavg(), "clients": args.clients, "rounds": args.rounds,
        "run_config": values, "run_seconds": run_s, "rounds_measured": rows, "eval_modes": modes,
        "note": "accuracy per mode is information only; no default was chosen on it"})
    print(f"wrote {path}")
    print(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()
