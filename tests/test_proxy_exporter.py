"""deploy/proxy_exporter.py: the Fleet proxy's nginx counters and refused answers as Prometheus series.

Fast: the stub_status parser, the incremental refusal log, the exposition. Slow: the real proxy (deploy/proxy.sh,
three nginx instances, no SuperLink behind it) answers 404, 413, 502 and 400 to crafted requests, the exporter
counts each, and a real Prometheus (Debian's, .ci/deps.sh) scrapes the exporter and answers queries for them."""

from __future__ import annotations

import http.client
import ssl
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.localfed import free_ports  # noqa: E402
from deploy.proxy_exporter import (ProxyExporter, RefusalLog, exposition, parse_stub_status,  # noqa: E402
                                   serve)
from tests._proxy_util import start_proxy  # noqa: E402
from tests.test_metrics import PROMETHEUS, _query, _samples, start_prometheus  # noqa: E402

STUB = """Active connections: 3 
server accepts handled requests
 17 16 42 
Reading: 0 Writing: 1 Waiting: 2 
"""


def test_stub_status_is_parsed_and_anything_else_is_named() -> None:
    assert parse_stub_status(STUB) == {"active": 3, "accepted": 17, "handled": 16, "requests": 42,
                                       "reading": 0, "writing": 1, "waiting": 2}
    with pytest.raises(ValueError, match="not an nginx stub_status page: '<html>"):
        parse_stub_status("<html>404</html>")


def test_the_refusal_log_is_read_incrementally_waits_for_whole_lines_and_survives_rotation(tmp_path: Path) -> None:
    path = tmp_path / "fleet-refused.log"
    log = RefusalLog(path)
    assert log.update() == {}                                   # not written yet
    path.write_bytes(b"503\n503\n413\n40")
    assert log.update() == {"503": 2, "413": 1}                 # "40" is half a line
    with path.open("ab") as fh:
        fh.write(b"4\ngarbage\n502\n")
    assert log.update() == {"503": 2, "413": 1, "404": 1, "502": 1}
    path.write_bytes(b"503\n")                                  # rotated: a shorter file
    assert log.update() == {"503": 3, "413": 1, "404": 1, "502": 1}   # counters never go down


def test_exposition_names_every_listener_and_marks_a_silent_one_down() -> None:
    from collections import Counter

    text = exposition({"fleet": parse_stub_status(STUB), "control": None},
                      {"fleet": Counter({"503": 2}), "control": Counter({"400": 1})})
    s = _samples(text)
    assert s['noniid_fl_proxy_up{listener="fleet"}'] == 1 and s['noniid_fl_proxy_up{listener="control"}'] == 0
    assert s['noniid_fl_proxy_connections{listener="fleet",state="active"}'] == 3
    assert s['noniid_fl_proxy_connections_accepted_total{listener="fleet"}'] == 17
    assert s['noniid_fl_proxy_connections_handled_total{listener="fleet"}'] == 16
    assert s['noniid_fl_proxy_requests_total{listener="fleet"}'] == 42
    assert s['noniid_fl_proxy_refused_total{listener="fleet",status="503"}'] == 2
    assert s['noniid_fl_proxy_refused_total{listener="control",status="400"}'] == 1
    assert not any('listener="control"' in k and "connections" in k for k in s)   # no stale numbers for it
    assert "# TYPE noniid_fl_proxy_refused_total counter" in text


def test_a_missing_run_dir_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ProxyExporter(tmp_path / "nope", {"fleet": 1})


# ============================================================================ slow: the real proxy
def _status(port: int, ca: Path, method: str, path: str, body: bytes | None = None) -> int:
    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=str(ca)),
                                       timeout=30)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/protobuf"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


@pytest.mark.slow
def test_the_real_proxy_counts_refusals_and_a_real_prometheus_scrapes_them(tmp_path: Path) -> None:
    assert Path(PROMETHEUS).is_file(), "prometheus is needed: run .ci/deps.sh"
    proxy = start_proxy(tmp_path, FLEET_MAX_BODY="16k")     # nothing listens at its SuperLink address
    metrics, web = free_ports(2)
    fleet, control, fstat, cstat, certs, run_dir = (proxy.fleet, proxy.control, proxy.fleet_status,
                                                    proxy.control_status, proxy.certs, proxy.run_dir)
    prom = None
    try:
        exporter = ProxyExporter(run_dir, {"fleet": fstat, "control": cstat})
        httpd = serve(exporter, "127.0.0.1", metrics)
        import threading

        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        before = _samples(exporter.render())
        ca = certs / "ca.crt"
        got = [_status(fleet, ca, "POST", "/v1/other"),                        # 404: not a Fleet route
               _status(fleet, ca, "POST", "/v1/fleet/get-run", b"\0" * 40_000),  # 413: over FLEET_MAX_BODY
               _status(fleet, ca, "POST", "/v1/fleet/get-run", b"\0" * 10),      # 502: no SuperLink
               _status(fleet, ca, "POST", "/v1/fleet/get-run", b"\0" * 10),
               _status(control, ca, "POST", "/v1/control/list-runs", b"")]      # 400: no operator certificate
        assert got == [404, 413, 502, 502, 400], got
        deadline = time.time() + 10
        while True:     # nginx writes its access log line as the request ends
            after = _samples(exporter.render())
            if after.get('noniid_fl_proxy_refused_total{listener="control",status="400"}') == 1 or \
                    time.time() > deadline:
                break
            time.sleep(0.2)
        assert after['noniid_fl_proxy_up{listener="fleet"}'] == after['noniid_fl_proxy_up{listener="control"}'] == 1
        for status, n in (("404", 1), ("413", 1), ("502", 2)):
            assert after[f'noniid_fl_proxy_refused_total{{listener="fleet",status="{status}"}}'] == n, after
        assert after['noniid_fl_proxy_refused_total{listener="control",status="400"}'] == 1
        # 4 requests on the Fleet listener (stub_status's own scrapes are served by the same instance)
        grown = after['noniid_fl_proxy_requests_total{listener="fleet"}'] - before['noniid_fl_proxy_requests_total{listener="fleet"}']
        assert grown >= 4
        prom, api = start_prometheus(tmp_path, "proxy", metrics, web)
        deadline = time.time() + 60
        while True:
            try:
                res = _query(api, 'noniid_fl_proxy_refused_total{job="proxy",listener="fleet",status="502"}')
                if res:
                    break
            except OSError:
                pass
            assert time.time() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.3)
        assert float(res[0]["value"][1]) == 2
        up = _query(api, 'noniid_fl_proxy_up{job="proxy"}')
        assert sorted((r["metric"]["listener"], float(r["value"][1])) for r in up) == [("control", 1.0), ("fleet", 1.0)]
        httpd.shutdown()
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        proxy.stop()
