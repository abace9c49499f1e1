"""Issue 42, item 4: a local user on a node host cannot make the SuperNode overwrite a file or fail to start.

The poll stamp (deploy/node_guard.py) lives in this user's private 0700 directory, never at a predictable name in
a shared directory; it is replaced through a random-named file (mkstemp), so a symlink at its path is replaced,
not followed; a directory planted by someone else (a symlink, another owner, group- or world-writable) is refused
by name at start; and a message "busy" for longer than BUSY_STALE is unhealthy (deploy/healthcheck.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import node_guard as ng
from deploy.healthcheck import poll_state

ROOT = Path(__file__).resolve().parent.parent


def test_the_default_stamp_lives_in_a_private_directory_created_0700(tmp_path):
    path = ng.stamp_path({"RUNTIME_PORT": "9300", "TMPDIR": str(tmp_path)})
    assert path == tmp_path / f"flower-supernode-{os.getuid()}" / "supernode-9300.poll"
    ng.stamp_dir(path)
    st = os.lstat(path.parent)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    ng.write_stamp(path, "idle", "x")
    assert ng.read_stamp(path)[0::2] == ("idle", "x") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["supernode-9300.poll"]  # no temp file left


def test_a_symlink_at_the_stamp_is_replaced_never_followed(tmp_path):
    victim = tmp_path / "root-only.secret"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    path = ng.stamp_path({"RUNTIME_PORT": "9301", "TMPDIR": str(tmp_path)})
    ng.stamp_dir(path)
    path.symlink_to(victim)  # planted (in a real attack: by whoever could write the directory)
    ng.write_stamp(path, "busy")
    assert victim.read_text() == "secret\n" and not path.is_symlink() and ng.read_stamp(path)[0] == "busy"


@pytest.mark.parametrize("plant", ["symlink", "file", "open-mode", "other-owner"])
def test_a_planted_private_directory_is_refused_by_name(tmp_path, monkeypatch, plant):
    path = ng.stamp_path({"RUNTIME_PORT": "9302", "TMPDIR": str(tmp_path)})
    if plant == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.parent.symlink_to(tmp_path / "elsewhere")
        match = "is a symlink or not a directory"
    elif plant == "file":
        path.parent.write_text("x")
        match = "is a symlink or not a directory"
    elif plant == "open-mode":
        path.parent.mkdir()
        path.parent.chmod(0o777)
        match = "writable by group or others \\(mode 777\\)"
    else:  # another user made it: seen from a uid that is not the directory's owner
        path.parent.mkdir(mode=0o700)
        monkeypatch.setattr(ng.os, "getuid", lambda: os.lstat(path.parent).st_uid + 1)
        match = "owned by uid"
    with pytest.raises(ValueError, match=match):
        ng.stamp_dir(path)


def test_a_poll_stamp_in_a_shared_directory_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    with pytest.raises(ValueError, match="writable by group or others"):
        ng.stamp_dir(shared / "node.poll")


def test_the_node_guard_exits_with_the_reason_instead_of_a_traceback(tmp_path):
    (tmp_path / f"flower-supernode-{os.getuid()}").write_text("planted")
    env = {**os.environ, "TMPDIR": str(tmp_path), "RUNTIME_PORT": "9303", "PYTHONPATH": str(ROOT)}
    env.pop("POLL_STAMP", None)
    res = subprocess.run([sys.executable, "-m", "deploy.node_guard", "--help"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and "is a symlink or not a directory" in res.stderr, res.stderr[-500:]


def test_a_message_busy_longer_than_busy_stale_is_unhealthy(tmp_path, monkeypatch):
    monkeypatch.setenv("POLL_STAMP", str(tmp_path / "node.poll"))
    ng.write_stamp(tmp_path / "node.poll", "busy")
    assert poll_state(120, now=time.time() + 100, busy_stale_s=150)[0]
    ok, why = poll_state(120, now=time.time() + 199, busy_stale_s=150)
    assert not ok and "busy for 199 s (> BUSY_STALE=150)" in why


def test_supernode_sh_sets_a_private_umask():
    text = (ROOT / "deploy" / "supernode.sh").read_text()
    lines = [ln.strip() for ln in text.splitlines()]
    assert "umask 077" in lines and lines.index("umask 077") < next(i for i, ln in enumerate(lines)
                                                                    if ln.startswith("args=("))


def test_localfed_auth_binds_every_node_key_to_its_client_id_as_production_does(tmp_path):
    import argparse

    from deploy.localfed import federation_from_args

    ns = argparse.Namespace(nodes=3, tls=False, auth=True, tuned=False, proxy=True, poll=0.5)
    fed = federation_from_args(ns, tmp_path)
    assert fed.node_auth and fed.tls and fed.proxy and fed.bind_clients == [0, 1, 2]
    assert fed.bindings == tmp_path.resolve() / "bindings" / "node-bindings.json"
    assert [fed.node_config(i) for i in range(3)] == [f"partition-id={i} num-partitions=3" for i in range(3)]
    plain = federation_from_args(argparse.Namespace(nodes=2, tls=True, auth=False, tuned=False, proxy=False,
                                                    poll=0.5), tmp_path / "plain")
    assert plain.bind_clients is None and plain.bindings is None


def test_a_stock_tls_node_gets_a_fresh_private_runtime_secret_per_start(tmp_path):
    """Issue 42 item 4 (task theft): deploy/supernode.sh's stock mode with TLS runs Flower's SuperExec in process
    isolation with a Runtime-API secret; without SUPEREXEC_SECRET_FILE it takes a fresh one per start from
    ``node_guard.py --make-runtime-secret``: 32 random bytes, 0600, in the node's private directory, replacing
    the last start's (nothing accumulates) and a symlink planted at its path (never followed)."""
    env = {"RUNTIME_PORT": "9310", "TMPDIR": str(tmp_path)}
    first = ng.runtime_secret(env)
    assert first == tmp_path / f"flower-supernode-{os.getuid()}" / "superexec-9310.secret"
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o600 and len(first.read_bytes()) == 32
    old = first.read_bytes()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    first.unlink()
    first.symlink_to(victim)
    again = ng.runtime_secret(env)
    assert again == first and not again.is_symlink() and again.read_bytes() != old and victim.read_bytes() == b"keep"
    assert sorted(p.name for p in again.parent.iterdir()) == ["superexec-9310.secret"]
    before = again.read_bytes()
    out = subprocess.run([sys.executable, str(ROOT / "deploy" / "node_guard.py"), "--make-runtime-secret"],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and Path(out.stdout.strip()) == first and first.read_bytes() != before


def test_supernode_sh_runs_stock_tls_nodes_in_process_isolation_with_the_secret():
    text = (ROOT / "deploy" / "supernode.sh").read_text()
    stock = text[text.index('if [ -n "${CA_CERT:-}" ]; then\n  # Stock mode'):]
    assert "--make-runtime-secret" in stock and "flower_superexec" in stock
    assert stock.count('--superexec-auth-secret-file "$secret"') == 2   # the SuperExec and the SuperNode
    assert "--isolation process" in stock


def test_without_the_private_pull_a_thread_stamps_idle_while_the_loop_runs(tmp_path, monkeypatch):
    """The public-API fallback of the per-poll stamp (flcore/internals.py's wrap_pull declines under
    NONIID_FL_PUBLIC_ONLY=1): 'idle' is stamped every PUBLIC_STAMP_EVERY s until the loop ends."""
    stamp = tmp_path / "node.poll"
    monkeypatch.setattr(ng, "PUBLIC_STAMP_EVERY", 0.05)
    done = ng._loop_heartbeat(stamp)
    deadline = time.time() + 5
    while not stamp.exists() and time.time() < deadline:
        time.sleep(0.02)
    first = ng.read_stamp(stamp)
    assert first[0] == "idle" and first[2] == "polling loop running"
    time.sleep(0.2)
    assert ng.read_stamp(stamp)[1] > first[1]  # renewed
    done.set()
    time.sleep(0.15)
    last = ng.read_stamp(stamp)[1]
    time.sleep(0.2)
    assert ng.read_stamp(stamp)[1] == last  # stopped with the loop
