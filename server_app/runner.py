"""The round driver: ServerApp main -> strategy.train_round -> evaluation -> results -> checkpoint.

    register clients (query)        stable client ids, sizes, class counts
    for each round:
        strategy.train_round()      sample, send, validate, aggregate (+ method phases, e.g. FedUFO relay)
        G-FL                        global model on the global test set (server side)
        P-FL                        the sampled clients' local models on their local test splits; and over
                                    all devices: each device's last local model (registry.all_devices_local_accuracy)
        client evaluation           every `federated-eval-every` rounds and at the end: the global model on
                                    every client's local test split (fairness, min/max-data client)
        results.json + checkpoint
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from flwr.serverapp import Grid

from data_partitioning.datasets import dataset_shape
from data_partitioning.federated import global_test_set, validation_set
from data_partitioning.support import training_pool_sample
from flcore.config import ConfigError, RunConfig
from flcore.records import load_params, model_params
from flcore.registry import get_method, resolve
from models import build_model
from models.evaluation import eval_support_size, evaluate, pop_eval_stats, set_eval_support
from models.numerics import applied, check_device, numerics_of
from models.representation import FeatureMoments, collapse_stats
from server_app.checkpoint import load_checkpoint, save_checkpoint
from server_app.diagnosis import divergence_note, majority_share
from server_app.metrics import MetricsServer, RunMetrics
from server_app.results import WRITE_INTERVAL_S, ResultsWriter, spread
from strategies.base import FLStrategy, RoundOutcome

log = logging.getLogger("noniid_fl")


_LINE_OBSERVERS: list[tuple[Callable[[str], None], bool]] = []


def _say(text: str) -> None:
    if all(echo for _, echo in _LINE_OBSERVERS):
        print(text, flush=True)
        log.info(text)
    for observer, _ in list(_LINE_OBSERVERS):
        observer(text)


@contextlib.contextmanager
def observe_lines(observer: Callable[[str], None], echo: bool = True) -> Iterator[None]:
    """Call ``observer`` with every line the run prints (its start, one per round, its end) while the block runs:
    what benchmarks time a run by (benchmarks/harness.py round_clock). ``echo=False`` also keeps the lines from
    being printed and logged meanwhile (a benchmark that counts the round's own work)."""
    entry = (observer, echo)
    _LINE_OBSERVERS.append(entry)
    try:
        yield
    finally:
        _LINE_OBSERVERS.remove(entry)


DONE_MARKER = "noniid-fl: run complete"  # scripts/run_local.sh looks for it in the streamed log


def clock(seconds: float) -> str:
    """``73.4`` -> ``1m13s``; under a minute with one decimal."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}h{m % 60:02d}m{s:02d}s" if m >= 60 else f"{m}m{s:02d}s"


def progress(rnd: int, first: int, last: int, t_start: float, t_rounds: float, now: float | None = None) -> str:
    """``elapsed 12.0s, ETA 30.0s``: time since the run started, and the rounds left at the mean pace of the
    rounds run so far in this process (``first`` .. ``rnd``)."""
    now = time.time() if now is None else now
    pace = (now - t_rounds) / (rnd - first + 1)
    return f"elapsed {clock(now - t_start)}, ETA {clock(pace * (last - rnd))}"


def build_strategy(cfg: RunConfig) -> FLStrategy:
    return resolve(get_method(cfg.method).strategy)(cfg)


def client_eval_summary(per_client: dict[int, dict], strategy: FLStrategy) -> dict[str, Any]:
    """Fairness of the global model over the clients that answered (all, or the federated-eval-clients
    sample): spread + min/max-data client."""
    if not per_client:
        return {}
    accs = {cid: float(m["accuracy"]) for cid, m in per_client.items()}
    s = spread(list(accs.values()))
    sizes = {cid: strategy.clients[cid].num_examples if cid in strategy.clients else int(per_client[cid]["num-examples"])
             for cid in accs}
    min_cid = min(sizes, key=lambda c: (sizes[c], c))
    max_cid = max(sizes, key=lambda c: (sizes[c], -c))
    return {"client_accuracy_mean": s["mean"], "client_accuracy_best": s["best"],
            "client_accuracy_worst": s["worst"], "client_accuracy_std": s["std"],
            "min_data_client": min_cid, "min_data_client_accuracy": accs[min_cid],
            "max_data_client": max_cid, "max_data_client_accuracy": accs[max_cid],
            "num_evaluated": len(accs), "per_client": {str(c): a for c, a in sorted(accs.items())}}


def round_row(server_round: int, outcome: RoundOutcome, g_loss: float, g_acc: float, wall: float) -> dict[str, Any]:
    local = [float(u.metrics["local-accuracy"]) for u in outcome.updates  # NaN: the client has no local test split
             if "local-accuracy" in u.metrics and math.isfinite(float(u.metrics["local-accuracy"]))]
    s = spread(local)
    return {"round": server_round, "global_accuracy": g_acc, "global_loss": g_loss,
            "local_accuracy": s["mean"], "local_accuracy_best": s["best"], "local_accuracy_worst": s["worst"],
            "local_accuracy_std": s["std"], "wall_time_s": wall, "bytes_sent": outcome.bytes_sent,
            "bytes_received": outcome.bytes_received, "num_sampled": len(outcome.sampled),
            "num_updates": len(outcome.updates), "num_failures": len(outcome.failures),
            "sampled": outcome.sampled, "failures": [f.as_dict() for f in outcome.failures]}


def wait_for_nodes_to_settle(grid: Grid, timeout: float, poll: float = 0.1, stable_polls: int = 3) -> int:
    """Wait until the grid's node count is the same over ``stable_polls`` polls ``poll`` s apart (at most
    ``timeout`` s). Flower's Ray simulation registers its nodes while the ServerApp already runs (measured: 8 of
    10,000 at the first look): the number of clients, and what depends on it (the synthetic global test set,
    FedDyn's m, SCAFFOLD's N), must come from the whole federation, not from the first few nodes. A grid whose
    ``nodes_fixed_at_start`` is true (the in-process engines': every node is made with the grid) is counted at
    once: polling it would only cost ``(stable_polls - 1) * poll`` seconds per run."""
    if getattr(grid, "nodes_fixed_at_start", False):  # an in-process grid: every node exists when it is built
        return len(list(grid.get_node_ids()))
    deadline = time.monotonic() + timeout
    last, same = -1, 0
    while True:
        count = len(list(grid.get_node_ids()))
        same = same + 1 if count == last and count > 0 else 0
        last = count
        if same >= stable_polls - 1 or time.monotonic() >= deadline:
            return count
        time.sleep(poll)


@dataclass
class Run:
    """What one run's rounds share: the config, the strategy, the server's model and evaluation sets, the
    results writer; built by :func:`start_run`."""

    cfg: RunConfig
    strategy: FLStrategy
    model: torch.nn.Module
    params: Any
    eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]]
    results: ResultsWriter
    num_clients: int
    t_start: float
    first: int = 1
    last_checkpoint: float = field(default=float("-inf"))


def start_run(grid: Grid, cfg: RunConfig, t_start: float) -> Run:
    """Build the strategy, register the clients, build the server's model and its evaluation sets (the G-FL
    test set unless test-evaluation is off, the validation union if any), open the results."""
    strategy = build_strategy(cfg)
    wait_for_nodes_to_settle(grid, cfg.round_timeout)
    strategy.refresh_clients(grid)
    num_clients = len(strategy.clients)
    device = torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    in_shape, num_classes = dataset_shape(cfg.dataset)
    model = build_model(cfg, in_shape, num_classes)
    params = model_params(model)
    model.to(device)
    try:
        check_device(numerics_of(cfg), device)  # the server evaluates under the run's precision too
    except ValueError as e:
        raise ConfigError(f"{e} (the server)") from None
    if eval_support_size(model):  # FedRANE's inductive evaluation: a seeded sample of the clients' training pool
        set_eval_support(model, torch.as_tensor(training_pool_sample(cfg, num_clients, eval_support_size(model)),
                                                device=device))
    eval_arrays = {}
    if cfg.test_evaluation:
        eval_arrays["global"] = global_test_set(cfg, num_clients)
    if cfg.validation_fraction > 0:
        eval_arrays["val"] = validation_set(cfg, num_clients)
    eval_sets = {k: (torch.as_tensor(x, device=device), torch.as_tensor(y, device=device))
                 for k, (x, y) in eval_arrays.items()}
    return Run(cfg, strategy, model, params, eval_sets, ResultsWriter(cfg.out_path, cfg), num_clients, t_start)


def resume(run: Run) -> None:
    """Bind the clients' state to this run; with ``resume-from``, continue from that checkpoint."""
    cfg, strategy = run.cfg, run.strategy
    strategy.begin_run()  # run-bound client state (client_app/state.py)
    if cfg.resume_from:
        ckpt = load_checkpoint(cfg.resume_from, run.results.run_config)
        run.params = ckpt["params"]
        strategy.load_state_dict(ckpt["strategy"])
        strategy.begin_run(resumed_after=int(ckpt["round"]), client_state=ckpt.get("client_state"))
        run.results.rounds = list(ckpt["rounds"])
        run.first = int(ckpt["round"]) + 1
        _say(f"resumed from {cfg.resume_from} after round {ckpt['round']}")


def evaluate_global(run: Run) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    """The global model on each evaluation set: (loss, accuracy) per set, and what the model measured (e.g. LRA
    graph density) with, on the G-FL test set, the collapse of its representations."""
    scores, stats = {}, {}
    device = next(run.model.parameters()).device
    with applied(run.model, numerics_of(run.cfg), device):  # the run's precision and memory format
        for name, (x, y) in run.eval_sets.items():
            moments = FeatureMoments() if name == "global" else None
            scores[name] = evaluate(run.model, x, y, moments=moments)
            stats.update({f"{name}_{k}": v for k, v in pop_eval_stats(run.model).items()})
            if moments is not None and moments.count:
                stats.update(collapse_stats(moments, f"{name}_feature"))
    return scores, stats


def assemble_row(run: Run, grid: Grid, rnd: int, outcome: RoundOutcome, scores: dict, stats: dict,
                 t0: float) -> dict[str, Any]:
    """The round's results.json row: the outcome, G-FL and validation scores, P-FL over the sampled and over
    all devices, registration failures, the federated evaluation when it is due, the method's metrics."""
    cfg, strategy = run.cfg, run.strategy
    g_loss, g_acc = scores.get("global", (None, None))
    row = round_row(rnd, outcome, g_loss, g_acc, 0.0)
    strategy.registry.note_local_models(outcome.updates)
    row.update(strategy.registry.all_devices_local_accuracy())
    row.update(stats)
    if "val" in scores:
        row["val_loss"], row["val_accuracy"] = scores["val"]
    registration = [f.as_dict() for f in strategy.registry.drain_failures()]
    if registration:  # nodes that could not register since the last round (asked again with back-off)
        row["failures"] = registration + row["failures"]
        row["num_failures"] = len(row["failures"])
    every = cfg.federated_eval_every
    if every and (rnd % every == 0 or rnd == cfg.num_server_rounds):
        per_client, failures = strategy.federated_evaluate(grid, rnd, run.params)
        row.update(client_eval_summary(per_client, strategy))
        row["failures"] += [f.as_dict() for f in failures]
        row["num_failures"] = len(row["failures"])
    row["strategy"] = strategy.round_metrics()
    row["wall_time_s"] = time.time() - t0
    return row


def checkpoint_if_due(run: Run, rnd: int) -> None:
    """Like results.json: after every round slower than WRITE_INTERVAL_S, and always after the last one."""
    cfg, strategy = run.cfg, run.strategy
    due = rnd == cfg.num_server_rounds or time.monotonic() - run.last_checkpoint >= WRITE_INTERVAL_S
    if cfg.checkpoint and due:
        assert strategy.ledger is not None  # bound by resume() before the first round
        save_checkpoint(cfg.out_path / "checkpoint.pt", server_round=rnd, params=run.params,
                        strategy_state=strategy.state_dict(), rounds=run.results.rounds,
                        run_config=run.results.run_config, client_state=strategy.ledger.to_dict())
        strategy.ledger.checkpoint_written(rnd)  # clients keep the state versions a resume from it needs
        run.last_checkpoint = time.monotonic()


def round_line(run: Run, rnd: int, row: dict[str, Any], t_rounds: float) -> str:
    local = f"{row['local_accuracy']:.4f}" if row["local_accuracy"] is not None else "n/a"
    g_acc, g_loss = row["global_accuracy"], row["global_loss"]
    gfl = f"G-FL acc {g_acc:.4f} loss {g_loss:.4f}" if g_acc is not None else "G-FL not evaluated"
    if "val_accuracy" in row:
        gfl += f" | val acc {row['val_accuracy']:.4f}"
    return (f"[round {rnd}/{run.cfg.num_server_rounds}] {gfl} | P-FL acc {local} | "
            f"{row['num_updates']}/{row['num_sampled']} updates, {row['num_failures']} failures | "
            f"{row['wall_time_s']:.1f}s | {progress(rnd, run.first, run.cfg.num_server_rounds, run.t_start, t_rounds)}")


def finish(run: Run) -> dict[str, Any]:
    """Write results.json, metrics.csv and the final model; the results document (the plot is the ServerApp's)."""
    results, num_clients = run.results, run.num_clients
    path = results.write(num_clients)
    results.write_csv()
    torch.save({k: torch.from_numpy(np.asarray(v)) for k, v in run.params.items()}, run.cfg.out_path / "final_model.pt")
    doc: dict[str, Any] = {"run_config": results.run_config, "rounds": results.rounds, "final": results.final(num_clients)}
    note = divergence_note(results.rounds, run.cfg, majority_share(run.eval_sets.get("global")))
    _say(f"{DONE_MARKER} in {time.time() - run.t_start:.1f}s: {len(results.rounds)} rounds, final G-FL accuracy "
         f"{doc['final'].get('global_accuracy')}; results in {path}")
    if note:  # the run's last line: it did not learn, and why that is likely
        _say(note)
    return doc


def start_metrics(run: Run) -> MetricsServer | None:
    """The Prometheus endpoint when ``metrics-port`` is set (server_app/metrics.py), holding a resumed run's
    rounds already."""
    cfg = run.cfg
    if not cfg.metrics_port:
        return None
    server = MetricsServer(RunMetrics({"method": cfg.method, "dataset": cfg.dataset, "partition": cfg.partition},
                                      run.t_start), cfg.metrics_host, cfg.metrics_port)
    for row in run.results.rounds:
        server.metrics.observe(row)
    _say(f"metrics for Prometheus on http://{cfg.metrics_host}:{server.port}/metrics")
    return server


def run_federation(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """Run ``num-server-rounds`` rounds; returns the results document (also written to out-dir)."""
    cfg = cfg.with_out_dir()  # as the entry point resolved it (a caller that did not: resolved here, once)
    run = start_run(grid, cfg, time.time())
    exporter = None
    try:  # the results writer holds the TensorBoard writer (and its thread) open between rounds
        resume(run)
        exporter = start_metrics(run)
        _say(f"{cfg.method} on {cfg.dataset} ({cfg.partition}), {run.num_clients} clients, "
             f"{cfg.num_server_rounds} rounds -> {cfg.out_path}")
        t_rounds = time.time()
        for rnd in range(run.first, cfg.num_server_rounds + 1):
            t0 = time.time()
            outcome = run.strategy.train_round(grid, rnd, run.params)
            run.strategy.check_client_state(outcome.failures)  # resumed without the clients' state: stop
            run.params = outcome.params
            load_params(run.model, run.params)
            scores, stats = evaluate_global(run)
            row = assemble_row(run, grid, rnd, outcome, scores, stats, t0)
            run.results.add_round(row)
            if exporter is not None:
                exporter.metrics.observe(row)
            checkpoint_if_due(run, rnd)
            _say(round_line(run, rnd, row, t_rounds))
        return finish(run)
    finally:
        run.results.close()
        if exporter is not None:
            exporter.close()
