"""The run's Prometheus endpoint (server_app/metrics.py; issue ops-live item 4): the series' values from rounds,
a scrape of a running federation, and a real Prometheus (Debian's ``prometheus``) scraping one."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from flcore.config import ConfigError, RunConfig, resolve_run_config
from server_app.metrics import CONTENT_TYPE, MetricsServer, RunMetrics

ROW = {"round": 3, "wall_time_s": 1.5, "num_sampled": 4, "num_updates": 2, "num_failures": 2, "num_registered": 4,
       "global_accuracy": 0.75, "global_loss": float("nan"), "local_accuracy": None, "bytes_sent": 1000,
       "bytes_received": 800, "failures": [{"cid": 1, "kind": "rejected"}, {"cid": 2, "kind": "timeout"}],
       "strategy": {"lambda_mean": 0.25, "note": "text is not a number", "flag": True}}


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_round_row_becomes_gauges_and_counters():
    m = RunMetrics({"method": "fedavg", "dataset": 'di"gits', "partition": "iid"}, start_time=10.0)
    m.observe(ROW)
    m.observe({**ROW, "round": 4, "failures": [{"cid": 2, "kind": "timeout"}], "global_accuracy": 0.8})
    text = m.exposition()
    got = _samples(text)
    assert got["noniid_fl_round"] == 4 and got["noniid_fl_global_accuracy"] == 0.8
    assert got["noniid_fl_sampled_nodes"] == 4 and got["noniid_fl_replied_nodes"] == 2
    assert got["noniid_fl_rejected_updates"] == 0          # the last round's
    assert got['noniid_fl_failures_total{kind="timeout"}'] == 2 and got['noniid_fl_failures_total{kind="rejected"}'] == 1
    assert got["noniid_fl_rounds_total"] == 2 and got["noniid_fl_bytes_sent_total"] == 2000
    assert got["noniid_fl_bytes_received_total"] == 1600 and got["noniid_fl_run_start_time_seconds"] == 10.0
    assert "noniid_fl_global_loss NaN" in text and "noniid_fl_local_accuracy" not in text   # None: not exported
    assert got['noniid_fl_strategy_metric{name="lambda_mean"}'] == 0.25
    assert 'name="note"' not in text and 'name="flag"' not in text                 # only numbers
    assert 'noniid_fl_run_info{dataset="di\\"gits",method="fedavg",partition="iid"} 1.0' in text
    assert "# TYPE noniid_fl_rounds_total counter" in text and "# TYPE noniid_fl_round gauge" in text


def test_the_server_serves_metrics_only_and_says_what_is_wrong_with_its_address():
    m = RunMetrics({"method": "fedavg"})
    server = MetricsServer(m, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"] == CONTENT_TYPE and b"noniid_fl_rounds_total 0.0" in r.read()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10)
        with pytest.raises(OSError, match="metrics-host/metrics-port: cannot listen on 127.0.0.1:"):
            MetricsServer(m, "127.0.0.1", server.port)
    finally:
        server.close()


def test_the_port_key_is_bounded():
    with pytest.raises(ConfigError, match="metrics-port"):
        RunConfig.from_dict(resolve_run_config({"metrics-port": 70000}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, port: int, rounds: int, after_round) -> dict:
    from server_app.runner import observe_lines, run_federation
    from tests.fakegrid import FakeGrid
    from tests.known_outputs import COMMON

    cfg = RunConfig.from_dict(resolve_run_config({**COMMON, "method": "fedavg", "num-server-rounds": rounds,
                                                  "metrics-port": port, "out-dir": str(tmp_path / "run")}))
    with observe_lines(lambda line: after_round(line) if line.startswith("[round ") else None, echo=False):
        return run_federation(FakeGrid(4), cfg)


def test_a_running_federation_is_scraped_round_by_round(tmp_path):
    port, seen = _free_port(), []

    def scrape(line: str) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            seen.append(_samples(r.read().decode()))

    doc = _run(tmp_path, port, 3, scrape)
    assert [s["noniid_fl_round"] for s in seen] == [1, 2, 3]
    assert [s["noniid_fl_rounds_total"] for s in seen] == [1, 2, 3]
    for s, row in zip(seen, doc["rounds"]):
        assert s["noniid_fl_global_accuracy"] == row["global_accuracy"]
        assert s["noniid_fl_replied_nodes"] == row["num_updates"] == 4
    assert seen[-1]["noniid_fl_bytes_sent_total"] == sum(r["bytes_sent"] for r in doc["rounds"])
    with pytest.raises(OSError):  # the endpoint closes with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _query(api: str, expr: str) -> list:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def start_prometheus(tmp_path: Path, job: str, target: int, web: int) -> tuple[subprocess.Popen, str]:
    """Debian's prometheus scraping 127.0.0.1:``target`` as ``job`` every 0.5 s, its HTTP API on ``web``;
    returns (the process, the API's base URL)."""
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    return proc, f"http://127.0.0.1:{web}"


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_federations_series_during_a_run(tmp_path):
    """Debian's prometheus (installed by .ci/deps.sh) scrapes the run every 0.5 s; each round waits until it
    has been scraped; afterwards its HTTP API holds the series with the run's values."""
    assert Path(PROMETHEUS).is_file(), "prometheus is not installed: run .ci/deps.sh"
    port, web = _free_port(), _free_port()
    proc, api = start_prometheus(tmp_path, "noniid-fl", port, web)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)

        def wait_for_scrape(line: str) -> None:
            rnd = int(line.split("/")[0].split()[-1])
            end = time.time() + 30
            while not any(float(r["value"][1]) == rnd for r in _query(api, 'noniid_fl_round{job="noniid-fl"}')):
                assert time.time() < end, f"round {rnd} was not scraped within 30 s"
                time.sleep(0.2)

        doc = _run(tmp_path, port, 3, wait_for_scrape)
        up = _query(api, 'max_over_time(up{job="noniid-fl"}[5m])')
        assert up and float(up[0]["value"][1]) == 1.0
        total = _query(api, "max_over_time(noniid_fl_rounds_total[5m])")
        assert float(total[0]["value"][1]) == 3
        acc = _query(api, "last_over_time(noniid_fl_global_accuracy[5m])")
        assert float(acc[0]["value"][1]) == pytest.approx(doc["rounds"][-1]["global_accuracy"])
        info = _query(api, "last_over_time(noniid_fl_run_info[5m])")
        assert info[0]["metric"]["method"] == "fedavg" and info[0]["metric"]["dataset"] == "digits"
        sent = _query(api, "max_over_time(noniid_fl_bytes_sent_total[5m])")
        assert float(sent[0]["value"][1]) == sum(r["bytes_sent"] for r in doc["rounds"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
