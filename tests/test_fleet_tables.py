"""benchmarks.fleet_tables (SCALING.md's fleet tables from bench_fleet's result files) and bench_fleet's
memory trace: values in, cells out; the committed doc matches the committed result files."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import fleet_tables
from benchmarks.bench_fleet import memory_trace


def _fleet(n: int, *, rss: float, uss: float) -> dict[str, Any]:
    mem = {"superlink_rss_mean": 150.0, "superlink_rss_peak": 170.0 + n, "serverapp_rss_peak": 600.0,
           "serverapp_uss_peak": 45.0 + n, "node_base_rss_mean": rss, "node_base_uss_mean": uss,
           "node_total_rss_peak_max": rss + 700.0, "node_total_uss_peak_max": uss + 100.0,
           "fleet_total_uss_peak": n * (uss + 100.0), "clientapp_rss_peak": 800.0, "clientapp_uss_peak": 500.0}
    return {"nodes": n, "connected_s": 10.4 + n, "loadavg_before": 1.25, "loadavg_after": 2.0,
            "idle": {"superlink_cpu_per_s": 0.01 * n, "nodes_cpu_per_s": 0.1 * n, "memory": mem},
            "job": {"round_s": [5.04, 6.06, 7.0], "superlink_cpu_s": 3.0 * n, "memory": mem}}


def _doc(fleets: list[dict[str, Any]], name: str = "fleet") -> dict[str, Any]:
    return {"benchmark": name, "written": "2026-01-02 03:04:05", "args": {"nodes": [f["nodes"] for f in fleets],
                                                                         "rounds": 3}, "fleets": fleets}


def test_tuned_rows_carry_the_measured_values_and_say_why_a_size_is_missing() -> None:
    skipped = {"nodes": 30, "loadavg_before": 3.5, "skipped": "needs ~22.0 GiB, 10.4 GiB available"}
    lines = fleet_tables.tuned(_doc([_fleet(3, rss=900.0, uss=512.0), skipped]))
    assert lines[0] == ("*2026-01-02 03:04:05, `fleet.json`, 3, 30 nodes asked, load average 1.2-3.5; stack not recorded "
                        "(result written before results named their stack).*")
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells == ["3", "13 s", "5.0, 6.1, 7.0", "150 / 173", "600 / 48", "900 / 512", "1,600 / 612", "1.8",
                     "0.030 / 9.0", "0.30", "1.2 / 2.0"]
    assert lines[5].startswith("| 30 | not measured: needs ~22.0 GiB, 10.4 GiB available |")
    assert lines[5].count("|") == lines[4].count("|")  # the row keeps the table's shape


def test_insecure_pairs_the_sizes_present_in_both_files() -> None:
    secure = _doc([_fleet(3, rss=900.0, uss=500.0), _fleet(30, rss=900.0, uss=500.0)])
    plain = _doc([_fleet(3, rss=800.0, uss=450.0)], name="fleet_insecure")
    plain["fleets"][0]["job"]["superlink_cpu_s"] = 8.55
    rows = fleet_tables.insecure(secure, plain)[4:]
    assert rows == ["| 3 | 9.0 | 8.6 | 0.030 | 0.030 |"]


def test_stragglers_name_the_late_clients_and_their_rounds() -> None:
    fleet = _fleet(10, rss=900.0, uss=500.0)
    fleet["stragglers"] = [{"delay_s": 32.0, "round_timeout_s": 30.0, "stragglers": [8, 9],
                            "round_s": [9.3, 32.4, 32.7], "num_updates": [10, 8, 8],
                            "failures": [[], [[8, "train", "timeout"], [9, "train", "timeout"]],
                                         [[9, "train", "timeout"]]]}]
    row = fleet_tables.stragglers(_doc([fleet]))[-1]
    assert row == ("| 10 nodes, 2 frozen 32 s (> round-timeout 30 s) | 9.3 s | 32.4 s, 32.7 s | 10, 8, 8 | "
                   "clients 8, 9: `train` `timeout` in rounds 2, 3 |")


def test_rewrite_fills_every_marked_block_from_its_files_and_leaves_the_rest() -> None:
    docs = {"a": _doc([_fleet(3, rss=900.0, uss=512.0)], name="a"), "b": _doc([_fleet(3, rss=1.0, uss=1.0)], name="b")}
    text = ("intro $1 \\1\n<!-- fleet-tables:tuned:a -->\nold\n<!-- /fleet-tables -->\nmiddle\n"
            "<!-- fleet-tables:insecure:a:b -->\n<!-- /fleet-tables -->\nend\n")
    out = fleet_tables.rewrite(text, docs.__getitem__)
    assert out.startswith("intro $1 \\1\n<!-- fleet-tables:tuned:a -->\n*2026-01-02 03:04:05, `a.json`")
    assert "old" not in out and "\nmiddle\n" in out and out.endswith("<!-- /fleet-tables -->\nend\n")
    assert "| 3 | 13 s | 5.0, 6.1, 7.0 | 150 / 173 |" in out and "| 3 | 9.0 | 9.0 | 0.030 | 0.030 |" in out
    assert fleet_tables.rewrite(out, docs.__getitem__) == out  # idempotent


def test_a_bad_marker_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown fleet table 'tuneed'"):
        fleet_tables.rewrite("<!-- fleet-tables:tuneed:a -->\n<!-- /fleet-tables -->", lambda n: {})
    with pytest.raises(ValueError, match="'insecure' reads 2 result file"):
        fleet_tables.rewrite("<!-- fleet-tables:insecure:a -->\n<!-- /fleet-tables -->", lambda n: {})
    with pytest.raises(ValueError, match="nosuchrun.json is missing"):
        fleet_tables.rewrite("<!-- fleet-tables:tuned:nosuchrun -->\n<!-- /fleet-tables -->")


def test_scaling_doc_matches_the_committed_fleet_results() -> None:
    text = fleet_tables.DOC.read_text()
    assert len(fleet_tables.MARK.findall(text)) >= 5
    assert fleet_tables.rewrite(text) == text, "run `python -m benchmarks.fleet_tables`"


def test_memory_trace_keeps_one_sample_per_interval_with_fleet_and_link_pss() -> None:
    rows = [{"t": 100.0 + i, "mem_available_mib": 9000.0 - 10 * i,
             "nodes": {0: {"base": (0, 500.0, 1), "app": (0, 10.0 * i, 1)},
                       1: {"base": (0, 400.0, 1), "app": (0, 0, 1)}},
             "superlink": (0, 120.0, 1), "link_superexec": (0, 500.0, 1), "serverapp": (0, 40.0, 1)}
            for i in range(12)]
    assert memory_trace(rows, 99.0) == [[1.0, 9000, 900, 660], [6.0, 8950, 950, 660], [11.0, 8900, 1000, 660]]
