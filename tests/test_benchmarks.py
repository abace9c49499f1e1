"""Math of the benchmark helpers (benchmarks/stats.py, bench_scale.fraction_for) and the shared
parameter record of the strategy base (the memory fix measured by benchmarks/bench_scale.py).
No timing is asserted anywhere: timings are what the benchmarks report, not what tests check."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from benchmarks.bench_scale import fraction_for
from benchmarks.stats import growth_exponent, paired_ratios, per_client_increment, steady_state, summary


def test_summary_median_spread_and_empty():
    s = summary([3.0, 1.0, 2.0, 10.0])
    assert s["n"] == 4 and s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["mean"] == 4.0 and s["spread"] == pytest.approx((10.0 - 1.0) / 2.5)
    assert summary([5.0])["median"] == 5.0 and summary([5.0])["spread"] == 0.0
    assert summary([])["median"] is None and summary([float("nan"), None])["n"] == 0


def test_steady_state_separates_startup_from_rounds():
    # launched at t=0; 20 s of start-up, then rounds of 2 s (one slow outlier of 5 s)
    ends = [22.0, 24.0, 26.0, 31.0, 33.0]
    st = steady_state(0.0, ends)
    assert st["intervals_s"] == [2.0, 2.0, 5.0, 2.0]
    assert st["per_round_s"] == 2.0  # the median ignores the outlier
    assert st["startup_s"] == pytest.approx(20.0)  # end of round 1 minus one steady round
    assert st["total_s"] == 33.0
    st2 = steady_state(0.0, ends, skip=2)  # rounds 3.. only
    assert st2["intervals_s"] == [2.0, 5.0, 2.0]


def test_steady_state_rejects_too_few_rounds():
    with pytest.raises(ValueError, match="at least 2 rounds"):
        steady_state(0.0, [1.0])
    with pytest.raises(ValueError, match="skip"):
        steady_state(0.0, [1.0, 2.0, 3.0], skip=0)


def test_paired_ratios():
    assert paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def test_growth_exponent_recovers_power_laws():
    xs = [10, 100, 1000]
    assert growth_exponent(xs, [50.0, 50.0, 50.0]) == pytest.approx(0.0)      # flat
    assert growth_exponent(xs, [3.0 * x for x in xs]) == pytest.approx(1.0)   # linear
    assert growth_exponent(xs, [x ** 2 for x in xs]) == pytest.approx(2.0)    # quadratic
    with pytest.raises(ValueError):
        growth_exponent([10, 10], [1.0, 2.0])


def test_per_client_increment_is_the_least_squares_slope():
    xs = [10, 100, 1000]
    ys = [100.0 + 0.5 * x for x in xs]
    assert per_client_increment(xs, ys) == pytest.approx(0.5)
    # hand-computed: x = 0, 1, 2; y = 0, 1, 5 -> slope = sum((x - 1)(y - 2)) / sum((x - 1)^2) = 5 / 2
    assert per_client_increment([0, 1, 2], [0.0, 1.0, 5.0]) == pytest.approx(2.5)


@pytest.mark.parametrize("sampled,clients", [(10, 10), (10, 100), (10, 1000), (7, 1000), (3, 30), (10, 30)])
def test_fraction_for_gives_exactly_the_sampled_count(sampled, clients):
    frac = fraction_for(sampled, clients)
    assert 0 < frac <= 1 and math.ceil(frac * clients) == sampled


def test_params_record_is_shared_within_an_exchange_and_rebuilt_for_new_params():
    from flcore.config import RunConfig
    from flcore.records import record_to_params
    from strategies.base import FLStrategy

    strategy = FLStrategy(RunConfig())
    params = OrderedDict([("w", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.ones(2, np.float32))])
    a = strategy.train_content(1, 0, params)["arrays"]
    b = strategy.train_content(1, 1, params)["arrays"]
    assert a is b  # one serialized copy for every client of the round
    back = record_to_params(a)
    assert all(np.array_equal(back[k], params[k]) for k in params)
    new = OrderedDict((k, v + 1) for k, v in params.items())  # the next round's model
    c = strategy.train_content(2, 0, new)["arrays"]
    assert c is not a and np.array_equal(record_to_params(c)["b"], new["b"])
    assert strategy.messages.params_record(new) is c
    new["b"] = np.zeros(2, np.float32)  # same dict object, one array replaced: the memo is not stale
    swapped = strategy.messages.params_record(new)
    assert swapped is not c and np.array_equal(record_to_params(swapped)["b"], np.zeros(2))
    run_cfg_a = strategy.messages.query()["run_config"]
    assert run_cfg_a is strategy.messages.query()["run_config"] and dict(run_cfg_a)["method"] == "fedavg"


def test_gne_benchmark_times_a_converged_aggregation_of_distinct_updates():
    from benchmarks.bench_gne import client_updates, fedrane_config, global_params, time_gne

    cfg = fedrane_config("mlp", **{"fedrane.gne-solver": "newton"})
    glob = global_params(cfg, "mlp")
    ups = client_updates(glob, 4)
    key = next(k for k, v in glob.items() if np.issubdtype(v.dtype, np.floating))
    deltas = [u.params[key] - glob[key] for u in ups]
    assert all(np.linalg.norm(d) > 0 for d in deltas)
    assert not np.allclose(deltas[0], deltas[1])  # client-specific parts: a non-trivial Gram matrix
    r = time_gne(cfg, glob, ups, repeats=1)
    assert r["gne_cpu_s"] > 0 and r["residual"] < 1e-8 and r["iterations"] >= 1


def test_exchange_clock_records_every_exchange_of_an_in_process_run(tmp_path):
    """The benchmarks' exchange clock observes every exchange (strategies/exchange.py observe_exchanges):
    registration, then train + evaluate per round,
    with the serialized model bytes of every message (logistic model on 8x8 digits: 64 x 10 + 10 float32
    values, plus one .npy header per array)."""
    from flwr.app import RecordDict

    from benchmarks.harness import run_inprocess
    from flcore.config import RunConfig, resolve_run_config
    from flcore.records import model_params, params_to_record
    from models import build_model
    import strategies.exchange as ex

    over = {"dataset": "digits", "model": "logistic", "num-server-rounds": 2, "checkpoint": False,
            "local-test-fraction": 0.25, "federated-eval-every": 1, "out-dir": str(tmp_path)}
    run = run_inprocess(over, num_nodes=3)
    calls = run["exchanges"]
    assert [(c["phase"], c["round"]) for c in calls] == [("register", 0), ("train", 1), ("evaluate", 1),
                                                         ("train", 2), ("evaluate", 2)]
    assert all(c["messages"] == c["replies"] == 3 for c in calls)
    params = model_params(build_model(RunConfig.from_dict(resolve_run_config(over)), (1, 8, 8), 10))
    model_bytes = ex.record_dict_nbytes(RecordDict({"arrays": params_to_record(params)}))
    assert (64 * 10 + 10) * 4 < model_bytes < (64 * 10 + 10) * 4 + 2 * 1024
    assert calls[0]["bytes_sent"] == 0 and all(c["bytes_sent"] == 3 * model_bytes for c in calls[1:])
    assert [c["bytes_received"] for c in calls[1:]] == [3 * model_bytes, 0] * 2   # evaluate sends no model back
    assert ex.exchange_observers() == 0                                           # detached afterwards


def test_exchange_clock_sees_the_exchanges_of_the_method_packages_too(tmp_path):
    """The clock is an exchange observer: it sees every exchange wherever it is sent, here FedMix's means request
    (strategies/methods/fedmix.py, through the round primitive) before each new client's first round."""
    from benchmarks.harness import run_inprocess

    over = {"method": "fedmix", "dataset": "digits", "model": "logistic", "num-server-rounds": 1,
            "checkpoint": False, "out-dir": str(tmp_path)}
    calls = run_inprocess(over, num_nodes=3)["exchanges"]
    assert [(c["phase"], c["round"], c["messages"]) for c in calls] == [("register", 0, 3), ("train.means", 1, 3),
                                                                         ("train", 1, 3)]


def test_round_clock_reads_the_tree_cpu_only_where_the_steady_state_needs_it(tmp_path):
    """With ``cpu_each_round=False`` the process tree's CPU (a /proc scan, ~0.8 ms) is read on the lines of
    rounds 1 and R-1 and on lines that are not round lines, never on the others; bench_overhead's per-round
    CPU is then the mean over rounds 2 .. R-1."""
    from benchmarks.bench_overhead import _measure
    from benchmarks.harness import run_inprocess, steady_bound_round

    assert [steady_bound_round(f"[round {k}/5] G-FL acc 0.1") for k in range(1, 6)] == [True, False, False, True, False]
    assert steady_bound_round("fedavg on digits (dirichlet), 3 clients, 5 rounds -> out")
    over = {"dataset": "digits", "model": "logistic", "num-server-rounds": 5, "checkpoint": False,
            "out-dir": str(tmp_path)}
    run = run_inprocess(over, num_nodes=3, cpu_each_round=False)
    cpu = run["round_end_cpu"]
    assert len(cpu) == 5 and [c is None for c in cpu] == [False, True, True, False, True]
    assert cpu[3] >= cpu[0] >= run["cpu_start"]
    out = _measure(run["t_start"], run["cpu_start"], run["round_ends"], cpu, [0.0] * 5)
    assert out["cpu_per_round_s"] == pytest.approx((cpu[3] - cpu[0]) / 3)
    with pytest.raises(ValueError, match="round 1 and round R-1"):
        _measure(0.0, 0.0, [1.0, 2.0, 3.0], [1.0, None, None], [0.0] * 3)


def test_tree_cpu_seconds_counts_this_process_finely_and_its_children():
    """This process's CPU comes from getrusage (microseconds, not /proc's 10 ms ticks) and a child's CPU is
    counted while it runs and after it is reaped."""
    import resource
    import subprocess
    import sys
    import time

    from benchmarks.harness import tree_cpu_seconds

    a = tree_cpu_seconds()
    x = 0
    t = time.process_time()
    while time.process_time() - t < 0.003:  # 3 ms of work: below one /proc tick
        x += 1
    assert tree_cpu_seconds() - a >= 0.003

    def others() -> float:  # the tree's CPU minus this process's own
        me = resource.getrusage(resource.RUSAGE_SELF)
        return tree_cpu_seconds() - me.ru_utime - me.ru_stime

    before = others()
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(30)"])
    try:
        deadline = time.time() + 20
        while others() - before < 0.25 and time.time() < deadline:  # live child, read from /proc
            time.sleep(0.05)
        assert others() - before >= 0.2  # (/proc counts the child in 10 ms ticks)
    finally:
        child.kill()
        child.wait()
    assert others() - before >= 0.2  # reaped: now in RUSAGE_CHILDREN


def test_bench_set_parses_typed_run_config_overrides():
    from benchmarks.harness import set_overrides as overrides

    assert overrides(["checkpoint=false", "lr=0.1", "local-epochs=2", "method=fedprox", "x=TRUE"]) == {
        "checkpoint": False, "lr": 0.1, "local-epochs": 2, "method": "fedprox", "x": True}
    with pytest.raises(SystemExit, match="key=value"):
        overrides(["checkpoint"])


def test_deployment_task_lines_give_per_task_medians(tmp_path):
    from benchmarks.bench_deployment import task_times

    (tmp_path / "supernode-0.log").write_text(
        "INFO [flwr_tuned] flwr-clientapp (pid 11) exited 0 after 1.50s wall, 0.40s CPU\n"
        "INFO [flwr_tuned] flwr-serverapp (pid 12) exited 0 after 30.00s wall, 9.00s CPU\n"
        "INFO [flwr_tuned] flwr-clientapp (pid 13) exited 0 after 2.50s wall, 0.60s CPU\n")
    (tmp_path / "supernode-1.log").write_text("flwr-clientapp (pid 21) exited 1 after 0.50s wall, 0.20s CPU\n")
    assert task_times(tmp_path) == {"clientapp_tasks": 3, "clientapp_wall_median_s": 1.5, "clientapp_cpu_median_s": 0.4}
    assert task_times(tmp_path / "nothing") == {}


def test_report_engine_targets_use_the_best_of_the_repeats():
    from benchmarks.report import engine_targets
    from benchmarks.stats import summary

    def cfg(workers, plain, inproc, flower):
        """A bench_overhead config summary from per-repeat seconds per round (wall = CPU here)."""
        times = {"plain": plain, "inprocess": inproc, "flower": flower}
        out = {"workers": workers}
        for name, xs in times.items():
            out[f"{name}.per_round_s"] = out[f"{name}.cpu_per_round_s"] = summary(xs)
        for name in ("inprocess", "flower"):
            out[f"{name}/plain"] = out[f"{name}/plain cpu"] = summary([a / b for a, b in zip(times[name], plain)])
        return out

    ov = {"configs": [cfg(1, [5.0, 5.2, 5.1], [5.3, 5.6, 5.4], [5.6, 5.7, 5.8]),
                      cfg(2, [3.0, 3.1, 3.2], [2.9, 3.2, 3.0], [4.0, 4.1, 4.2])]}
    ovs = {"configs": [cfg(1, [0.02, 0.021, 0.02], [0.03, 0.031, 0.029], [0.2, 0.2, 0.21])]}
    rows, lines = engine_targets(ov, ovs, {"mnist-5k": None, "digits": None}, None, None)
    verdicts = {r[0]: r[-1] for r in rows}
    assert verdicts["engine / plain loop, mnist-5k ConvNet, 10 clients"] == "**met**"        # 5.3 / 5.0 = 1.06
    assert verdicts["engine / plain loop, digits MLP, 10 clients"] == "**not met**"          # 0.029 / 0.02 = 1.45
    assert verdicts["2 worker processes vs 1, mnist-5k (throughput)"] == "**met**"           # 5.3 / 2.9 = 1.83
    assert "1.060 wall" in rows[0][2] and "1.83x best of 3" in rows[2][2]
    assert len(lines) == 3 and all(line.startswith("- ") for line in lines)


def test_callgrind_annotate_lines_become_per_function_counts():
    from benchmarks.bench_instructions import parse_annotate

    text = """--------------------------------------------------------------------------------
1,766,006,436 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
243,406,890 (13.78%)  ???:mkl_sgemm_kernel [/x/libtorch_cpu.so]
 44,204,502 ( 2.50%)  /tmp/python-build.2026/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/x/libpython.so]
  1,000,000 ( 0.05%)  /tmp/python-build.2027/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2
"""
    assert parse_annotate(text) == {"???:mkl_sgemm_kernel": 243_406_890,
                                    "ceval.c:_PyEval_EvalFrameDefault'2": 45_204_502}


def test_the_minimal_client_app_learns_exactly_as_the_real_one(tmp_path):
    """bench_client_floor's minimal ClientApp is only a fair floor if it does the real ClientApp's learning:
    the same global accuracy and loss in every round, and the same client metrics."""
    from benchmarks.bench_client_floor import VARIANTS, engine_round_cpu

    over = {"dataset": "digits", "num-server-rounds": 3, "checkpoint": False, "seed": 3,
            "federated-eval-every": 0}
    accuracies = [engine_round_cpu({**over, "out-dir": str(tmp_path / name.replace(" ", "-"))}, 4, app)[1]
                  for name, app in VARIANTS.items()]
    assert accuracies[0] == accuracies[1] and len(accuracies[0]) == 3
    rounds = [json.loads((tmp_path / name.replace(" ", "-") / "results.json").read_text())["rounds"]
              for name in VARIANTS]
    for real, minimal in zip(*rounds):
        assert real["global_loss"] == minimal["global_loss"]
        assert real["local_accuracy"] == minimal["local_accuracy"]


def test_the_sweep_benchmark_sees_every_run_reuse_its_model_and_summarises_its_rows(tmp_path):
    """bench_sweep: each run of a sweep (a new run config each time) builds its model once, however many runs
    came before it in the process; the summary compares the last three runs with the first three."""
    from benchmarks.bench_sweep import sweep, summarise
    from client_app.model_pool import POOL

    runs = POOL.max_keys + 2
    rows = sweep("digits", 2, 3, runs, str(tmp_path))
    assert [r["run"] for r in rows] == list(range(1, runs + 1))
    assert [r["model_builds"] for r in rows] == [1] * runs  # 2 clients x 3 rounds = 6 messages per run
    assert all(r["cpu_per_round_s"] > 0 and r["rss_mib"] > 0 for r in rows)
    fake = [{"run": k + 1, "cpu_per_round_s": c, "model_builds": b, "rss_mib": m}
            for k, (c, b, m) in enumerate([(1, 1, 100), (2, 1, 101), (3, 1, 102), (4, 1, 103), (5, 6, 106), (6, 1, 108)])]
    s = summarise(fake)
    assert s["first3_cpu_per_round_s"] == 2 and s["last3_cpu_per_round_s"] == 5 and s["last3_over_first3"] == 2.5
    assert s["rss_growth_mib_per_run"] == (108 - 102) / 3 and s["max_model_builds_after_first"] == 6


def test_report_summary_lines_for_the_floor_and_the_sweep():
    from benchmarks.report_engine import summary_lines

    floor = {"best_ratio_to_plain": {"real ClientApp": 1.16, "minimal ClientApp": 1.13}, "args": {"repeats": 5}}
    sweep = {"args": {"runs": 24}, "last3_over_first3": 0.98, "max_model_builds_after_first": 1,
             "rss_growth_mib_per_run": 0.04}
    before = {**sweep, "last3_over_first3": 1.345, "max_model_builds_after_first": 100, "rss_growth_mib_per_run": 1.72}
    floor_line, sweep_line = summary_lines(floor, sweep, before)
    assert "1.130 of the plain loop" in floor_line and "1.160" in floor_line and "~0.03 of the ratio" in floor_line
    assert "0.980, at most 1 model build(s)" in sweep_line and "+0.04 MiB" in sweep_line
    assert "1.345, 100 builds per run, +1.72 MiB" in sweep_line
    assert summary_lines(None, None) == []
