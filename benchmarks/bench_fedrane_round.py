"""FedRANE's round cost next to FedAvg's on Fashion-MNIST (issue 31 item 4), from one run of this script.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_fedrane_round [--clients 20] [--epochs 1] [--max-steps 0]
        [--methods fedavg fedrane fedrane-code] [--profile-steps 8]

Each method runs the same job: preset ``fedrane-fmnist-dir01`` (Fashion-MNIST, Dirichlet(0.1), ConvNet, batch
128, lr 0.5, 25% local test split, the paper's FedRANE keys: alternating SLIM solve, lra-cut = none, inductive
evaluation) with ``method`` replaced, ``--epochs`` local epochs, one round, ``--clients`` clients, in-process
(tests/fakegrid.py: the real round driver, ClientApp and evaluations, one process, one torch thread). A round
is everything it does: local training, the clients' P-FL evaluations (the received global model before
training and the trained one after), the server's G-FL evaluation of the 10,000 test images and the
aggregation. The clock is this process's CPU time (``time.process_time``) from the round's start to its end,
so other processes on a shared box do not count; wall seconds are recorded next to it. The ratio printed is
FedRANE's round CPU over FedAvg's, both measured here, in this run.

``--profile-steps`` > 0 adds a cProfile pass of FedRANE with local steps capped at that number, and records
the cumulative CPU share of: local training, the graph masks (SLIM solve or complete graph), message passing,
all evaluations, the Nash aggregation. Writes benchmarks/results/fedrane_round.json; ``--report`` prints
docs/FEDRANE.md's table from it.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.harness import loadavg, machine, parser, print_report, set_overrides, write_result  # noqa: E402
from flcore.methods.fedrane import before_issue_40  # noqa: E402

PRESET = "fedrane-fmnist-dir01"
# where a FedRANE round spends its time: (label, file suffix, function name) of the cProfile entries
PHASES = (("local training (all methods' loop, graph included)", "client_app/training.py", "local_train"),
          ("evaluation (client P-FL x2 + server G-FL)", "models/evaluation.py", "evaluate"),
          ("graph masks (SLIM solve / complete graph)", "models/fedrane/relation_graph.py", "mask_from_pearson"),
          ("message passing", "models/fedrane/neck.py", "propagate"),
          ("inductive evaluation graphs", "models/fedrane/neck.py", "augment_inductive"),
          ("Nash aggregation (Gram + solve)", "strategies/methods/fedrane/strategy.py", "aggregate"))


def job(method: str, clients: int, epochs: int, max_steps: int, out_dir: Path) -> dict[str, Any]:
    # the FedRANE values its recorded results ran with (the defaults before issue 40)
    return {"preset": PRESET, "method": method, **before_issue_40("fedrane"), **before_issue_40("fedrane-code"),
            "fedrane.lra-cut": "none", "num-server-rounds": 1, "local-epochs": epochs,
            "max-local-steps": max_steps, "checkpoint": False, "out-dir": str(out_dir)}


def run_round(overrides: dict[str, Any], clients: int) -> dict[str, Any]:
    """One in-process round: CPU and wall seconds, and what it computed."""
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config(overrides))
    c, w = time.process_time(), time.perf_counter()
    doc = run_federation(FakeGrid(clients), cfg)
    cpu, wall = time.process_time() - c, time.perf_counter() - w
    r = doc["rounds"][0]
    return {"cpu_s": cpu, "wall_s": wall, "global_accuracy": r["global_accuracy"],
            "local_accuracy": r.get("local_accuracy"), "num_updates": r["num_updates"],
            "num_failures": r["num_failures"]}


def profile_phases(overrides: dict[str, Any], clients: int) -> dict[str, Any]:
    """Cumulative CPU share of each of PHASES in one profiled round."""
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config(overrides))
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    run_federation(FakeGrid(clients), cfg)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    total = max(v[3] for v in stats.values())
    out = {"total_cpu_s": total}
    for label, suffix, name in PHASES:
        cum = sum(v[3] for (f, _, n), v in stats.items() if n == name and f.endswith(suffix))
        out[label] = {"cpu_s": cum, "share": cum / total if total else float("nan")}
    return out


# the evaluation of one batch of test images under each graph path (the probe): extra keys over the preset
PROBE = {"fedavg (no neck)": {"method": "fedavg"},
         "fedrane, complete graph (lra-cut none: no solve)": {},
         "fedrane, SLIM solve kept (lra-topk 10^6: same masks, the cost before)": {"fedrane.lra-topk": 10 ** 6},
         "fedrane, default row-mean cut (alternating solve per test image)": {"fedrane.lra-cut": "row-mean"},
         "fedrane, row-mean cut, closed-form solve (lra-graph closed-form)": {"fedrane.lra-cut": "row-mean",
                                                                               "fedrane.lra-graph": "closed-form"}}


def eval_probe(n: int, clients: int) -> dict[str, Any]:
    """CPU seconds of the G-FL evaluation of the first ``n`` test images with the initial model, per PROBE
    entry (inductive evaluation against the server's support sample, as a round evaluates)."""
    from data_partitioning.federated import global_test_set
    from data_partitioning.support import training_pool_sample
    from flcore.config import RunConfig, resolve_run_config
    from models import build_model
    from models.evaluation import eval_support_size, evaluate, set_eval_support

    out = {}
    for label, over in PROBE.items():
        cfg = RunConfig.from_dict(resolve_run_config({"preset": PRESET, **over}))
        x, y = (torch.as_tensor(a)[:n] for a in global_test_set(cfg, clients))
        model = build_model(cfg, tuple(x.shape[1:]), 10)
        size = eval_support_size(model)
        if size:
            set_eval_support(model, torch.as_tensor(training_pool_sample(cfg, clients, size)))
        c = time.process_time()
        evaluate(model, x, y)
        out[label] = {"images": int(x.shape[0]), "cpu_s": time.process_time() - c}
        print(f"  probe {label:70s} {out[label]['cpu_s']:7.2f} s CPU / {x.shape[0]} images", flush=True)
    return out


def report(res: dict[str, Any]) -> str:
    """The markdown of docs/FEDRANE.md section 7 from a fedrane_round result."""
    load = res["machine"]["loadavg_at_start"][0], res["loadavg_at_end"][0]
    steps = f"capped at {res['max_local_steps']} local steps" if res["max_local_steps"] else "no step cap"
    extra = "".join(f", {k} = {v}" for k, v in res.get("extra", {}).items())
    lines = [f"Measured {res['written']} (`benchmarks/results/{res['benchmark']}.json`): preset `{res['preset']}`{extra}, "
             f"{res['clients']} clients, {res['local_epochs']} local epoch(s), {steps}, one round each in one "
             f"process, 1 torch thread; load average {load[0]:.1f} at the start and {load[1]:.1f} at the end on 2 "
             "shared cores (so wall seconds mostly measure the other work; the ratio uses this process's CPU)."]
    if res["runs"]:
        lines += ["", "| method | round CPU s | wall s | CPU / FedAvg's | G-FL after the round | updates |",
                  "|---|---|---|---|---|---|"]
    ratios = res["ratio_cpu_vs_fedavg"]
    for m, r in res["runs"].items():
        ratio = "1.00" if m == "fedavg" else f"{ratios[m]:.2f}"
        lines.append(f"| {m} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {ratio} | {r['global_accuracy']:.4f} | "
                     f"{r['num_updates']} |")
    probe = res.get("eval_probe")
    if probe:
        base = next(iter(probe.values()))["cpu_s"]
        n = next(iter(probe.values()))["images"]
        lines += ["", f"Evaluating {n} test images (G-FL, inductive, |S| = 127, the initial model), CPU s:", "",
                  "| evaluation path | CPU s | / FedAvg's |", "|---|---|---|"]
        for label, r in probe.items():
            lines.append(f"| {label} | {r['cpu_s']:.2f} | {r['cpu_s'] / base:.1f} |")
    prof = res.get("profile")
    if prof:
        lines += ["", f"Where a FedRANE round's CPU goes (cProfile, local steps capped at the profile pass's cap; "
                      f"nested phases overlap, total {prof['total_cpu_s']:.1f} s):", "",
                  "| phase | CPU s | share |", "|---|---|---|"]
        for label, _, _ in PHASES:
            lines.append(f"| {label} | {prof[label]['cpu_s']:.1f} | {100 * prof[label]['share']:.1f} % |")
    return "\n".join(lines)


def result_name(tag: str) -> str:
    return f"fedrane_round-{tag}" if tag else "fedrane_round"


def main() -> None:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0, help="cap on local steps (0: the whole epochs)")
    ap.add_argument("--methods", nargs="*", default=["fedavg", "fedrane"])
    ap.add_argument("--profile-steps", type=int, default=0, help="cProfile pass of fedrane with this step cap")
    ap.add_argument("--set", nargs="*", default=[], help="extra run-config key=value for every method")
    ap.add_argument("--probe-images", type=int, default=0, help="also time evaluating this many test images "
                    "on each graph path (0: no probe)")
    ap.add_argument("--report", action="store_true", help="print docs/FEDRANE.md's table from the result file")
    ap.add_argument("--tag", default="", help="result file fedrane_round-<tag>.json instead of fedrane_round.json")
    args = ap.parse_args()
    if args.report:
        print_report(result_name(args.tag), report, "no benchmarks/results/fedrane_round.json: run the benchmark first")
        return
    torch.set_num_threads(1)
    info = machine()
    extra = set_overrides(args.set)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.methods:
            runs[m] = run_round({**job(m, args.clients, args.epochs, args.max_steps, Path(tmp) / m), **extra},
                                args.clients)
            print(f"{m:14s} round CPU {runs[m]['cpu_s']:8.1f} s  wall {runs[m]['wall_s']:8.1f} s  "
                  f"G-FL {runs[m]['global_accuracy']:.4f}  updates {runs[m]['num_updates']}", flush=True)
        profile = None
        if args.profile_steps:
            profile = profile_phases({**job("fedrane", args.clients, args.epochs, args.profile_steps,
                                            Path(tmp) / "profile"), **extra}, args.clients)
    probe = eval_probe(args.probe_images, args.clients) if args.probe_images else None
    base = runs["fedavg"]["cpu_s"] if "fedavg" in runs else None
    ratios = {m: r["cpu_s"] / base for m, r in runs.items() if base and m != "fedavg"}
    for m, ratio in ratios.items():
        print(f"{m} round / fedavg round (CPU): {ratio:.2f}")
    if profile:
        for label, _, _ in PHASES:
            print(f"  {label:52s} {profile[label]['cpu_s']:8.1f} s  {100 * profile[label]['share']:5.1f} %")
    path = write_result(result_name(args.tag), {
        "machine": info, "loadavg_at_end": loadavg(), "preset": PRESET, "clients": args.clients,
        "local_epochs": args.epochs, "max_local_steps": args.max_steps, "extra": extra, "runs": runs,
        "ratio_cpu_vs_fedavg": ratios, "profile": profile, "eval_probe": probe,
        "note": "one round each, in-process, one torch thread; CPU time of this process"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
