"""The real Fleet/Control proxy (deploy/proxy.sh, three nginx instances) started alone for a test, with whatever
listens (or nothing) at its SuperLink upstream address."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deploy.localfed import free_ports

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proxy:
    proc: subprocess.Popen
    certs: Path
    run_dir: Path
    log: Path
    fleet: int
    control: int
    fleet_status: int
    control_status: int
    upstream: int

    @property
    def ca(self) -> Path:
        return self.certs / "ca.crt"

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=30)


def start_proxy(tmp_path: Path, upstream: int | None = None, **settings: str) -> Proxy:
    """Start deploy/proxy.sh on free loopback ports in front of ``upstream`` (a free port nothing listens on when
    None); ``settings`` are extra proxy.sh variables. Returns once both stub_status pages answer."""
    nginx = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")
    assert nginx, "nginx is needed: run .ci/deps.sh"
    certs, run_dir, log = tmp_path / "certs", tmp_path / "proxy", tmp_path / "proxy.log"
    subprocess.run(["bash", str(ROOT / "deploy" / "pki.sh"), str(certs), "0"], check=True, capture_output=True)
    fleet, control, health, fstat, cstat, free = free_ports(6)
    upstream = free if upstream is None else upstream
    env = {**os.environ, "CERTS_DIR": str(certs), "PROXY_HOST": "127.0.0.1", "FLEET_PORT": str(fleet),
           "CONTROL_PORT": str(control), "HEALTH_PORT": str(health), "FLEET_STATUS_PORT": str(fstat),
           "CONTROL_STATUS_PORT": str(cstat), "SUPERLINK_UPSTREAM": f"127.0.0.1:{upstream}",
           "PROXY_RUN_DIR": str(run_dir), "NGINX": nginx, **settings}
    proc = subprocess.Popen(["bash", str(ROOT / "deploy" / "proxy.sh")], env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), start_new_session=True)
    proxy = Proxy(proc, certs, run_dir, log, fleet, control, fstat, cstat, upstream)
    deadline = time.time() + 30
    while True:
        try:
            for port in (fstat, cstat):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/stub_status", timeout=2).read()
            return proxy
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                if proc.poll() is None:
                    proxy.stop()
                raise AssertionError(f"the proxy did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
