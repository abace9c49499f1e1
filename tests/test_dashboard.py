"""What an operator watches: deploy/grafana/noniid-fl-dashboard.json (valid JSON whose every query names only series
this project exports, the ServerApp's server_app/metrics.py and the proxy's deploy/proxy_exporter.py, and shows each)
and deploy/prometheus/alerts.yml (checked and unit-tested by Prometheus' own promtool, every alert in the runbook)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

from deploy.proxy_exporter import exposition as proxy_exposition
from deploy.proxy_exporter import parse_stub_status
from server_app.metrics import GAUGES, RunMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "noniid-fl-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


def _exported() -> set[str]:
    run = RunMetrics({"method": "fedavg", "dataset": "digits", "partition": "iid"})
    row = {key: 1.0 for key, _ in GAUGES.values()}
    run.observe({**row, "failures": [{"kind": "timeout"}], "bytes_sent": 1, "bytes_received": 1,
                 "strategy": {"m": 1.0}})
    stub = parse_stub_status("Active connections: 1\nserver accepts handled requests\n 1 1 1\n"
                             "Reading: 0 Writing: 1 Waiting: 0\n")
    text = run.exposition() + proxy_exposition({"fleet": stub}, {"fleet": Counter({"503": 1})})
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def test_the_dashboard_queries_only_exported_series_and_shows_each() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"]) and all(p["targets"] for p in dash["panels"])
    named = {m for e in exprs for m in re.findall(r"noniid_fl_[a-z_]+", e)}
    exported = _exported()
    assert named <= exported, sorted(named - exported)
    shown = exported - {"noniid_fl_run_info", "noniid_fl_run_start_time_seconds"}   # labels, not a time series
    assert shown <= named, sorted(shown - named)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]


def _promtool() -> str:
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    assert Path(tool).is_file(), "promtool is not installed (Debian's prometheus package): run .ci/deps.sh"
    return tool


def test_the_alert_rules_pass_promtool_and_their_own_unit_tests() -> None:
    for args in (["check", "rules", ALERTS.name], ["test", "rules", "alerts.test.yml"]):
        res = subprocess.run([_promtool(), *args], cwd=ALERTS.parent, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "SUCCESS" in res.stdout + res.stderr


def test_every_alert_names_exported_series_and_has_a_runbook_entry() -> None:
    import yaml

    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    named = {m for r in rules for m in re.findall(r"noniid_fl_[a-z_]+", r["expr"])}
    assert named <= _exported(), sorted(named - _exported())
    runbook = (ROOT / "docs" / "DEPLOYMENT.md").read_text().split("## Runbook", 1)
    assert len(runbook) == 2, "docs/DEPLOYMENT.md has no '## Runbook' section"
    missing = [r["alert"] for r in rules if f"`{r['alert']}`" not in runbook[1]]
    assert not missing, f"alerts without a runbook entry: {missing}"
