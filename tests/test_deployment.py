"""Deployment (issue 9) and its reliability part (issue 11).

Fast tests: the PKI script, the flwr connection config (read back with Flower's own parser), node data
files, the poll patch of deploy/tuned.py, the start scripts' refusals, and the container/Kubernetes
manifests. Slow tests share one federation of real processes on loopback (deploy/localfed.py ->
deploy/*.sh; started once, see node_local_fed): a TLS SuperLink with SuperNode authentication and five
SuperNodes; an unregistered node refused, a bad config refused by the ServerApp, `flwr run` of FedUFO
(named actions + client state across messages, federated evaluation), and one FedAvg run in which a node
whose ClientApp raises and a SuperNode killed mid-round are both recorded while the others train.
Every process is stopped in a finally block (process groups), also when an assertion fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from unittest import mock
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy import tuned  # noqa: E402
from deploy.connection import write_connection  # noqa: E402
from deploy.k8s_podman import load_kustomization  # noqa: E402
from deploy.localfed import LocalFederation, snapshot_app  # noqa: E402
from deploy.make_node_data import write_node_files  # noqa: E402

DEPLOY = ROOT / "deploy"
PKI = DEPLOY / "pki.sh"


def _pki(out: Path, n: int, *sans: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PKI), str(out), str(n), *sans], capture_output=True, text=True, check=True)


# ============================================================================ fast: PKI + connection
def test_pki_script_makes_verifiable_server_cert_and_p384_node_keys(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    _pki(out, 2, "DNS:superlink.example.org", "IP:10.1.2.3")
    verify = subprocess.run(["openssl", "verify", "-CAfile", out / "ca.crt", out / "server.crt"],
                            capture_output=True, text=True)
    assert verify.returncode == 0 and "OK" in verify.stdout
    text = subprocess.run(["openssl", "x509", "-in", out / "server.crt", "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    for san in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:superlink.example.org", "IP Address:10.1.2.3"):
        assert san in text
    assert "TLS Web Server Authentication" in text and "CA:FALSE" in text
    for i in range(2):
        pub = (out / "keys" / f"supernode-{i}.pub").read_text()
        assert pub.startswith("ecdsa-sha2-nistp384 ")  # the key type Flower's node auth accepts
        assert stat.S_IMODE((out / "keys" / f"supernode-{i}").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    # idempotent: a second call keeps every existing file and only adds the missing node key
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _pki(out, 3)
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"supernode-2", "supernode-2.pub"}


def test_pki_script_rejects_bad_arguments(tmp_path: Path) -> None:
    bad_n = subprocess.run(["bash", str(PKI), str(tmp_path / "c"), "three"], capture_output=True, text=True)
    assert bad_n.returncode == 2 and "NUM_NODES" in bad_n.stderr
    bad_san = subprocess.run(["bash", str(PKI), str(tmp_path / "c"), "1", "superlink.org"],
                             capture_output=True, text=True)
    assert bad_san.returncode == 2 and "DNS: or IP:" in bad_san.stderr


def test_connection_config_is_read_back_by_flower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.cli.flower_config import read_superlink_connection

    home = tmp_path / "home"
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    write_connection("trial", "127.0.0.1:9093", home=home)
    write_connection("prod", "fl.example.org:9093", ca, make_default=True, home=home)
    write_connection("trial", "127.0.0.1:9200", home=home)  # replaced, "prod" kept
    monkeypatch.setenv("FLWR_HOME", str(home))
    prod = read_superlink_connection("prod")
    assert (prod.address, prod.root_certificates, prod.insecure) == ("fl.example.org:9093", str(ca.resolve()), False)
    trial = read_superlink_connection("trial")
    assert (trial.address, trial.insecure) == ("127.0.0.1:9200", True)
    assert read_superlink_connection(None).name == "prod"  # the default
    with pytest.raises(ValueError, match="host:port"):
        write_connection("x", "no-port", home=home)
    with pytest.raises(FileNotFoundError):
        write_connection("x", "h:1", tmp_path / "missing.crt", home=home)


# ============================================================================ fast: node data, tuning
def test_node_data_files_hold_the_simulation_partition(tmp_path: Path) -> None:
    from data_partitioning.federated import client_arrays, node_arrays
    from flcore.config import RunConfig, resolve_run_config

    overrides = {"dataset": "digits", "partition": "dirichlet", "seed": 3}
    paths = write_node_files(tmp_path, 3, overrides)
    cfg = RunConfig.from_dict(resolve_run_config(overrides))
    for cid, path in enumerate(paths):
        want = client_arrays(cfg, cid, 3)
        got = node_arrays(str(path), cfg.local_test_fraction, cfg.seed + cid)
        for name in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        assert got.num_classes == want.num_classes == 10
    with pytest.raises(ValueError, match="num-clients"):
        write_node_files(tmp_path, 0, overrides)


def test_capped_sleep_patch_targets_the_installed_flower_polls() -> None:
    import flwr.superlink.grid.http_grid as grid_mod
    import flwr.supernode.start_client_internal as node_mod

    saved = (grid_mod.time, node_mod.time)
    try:
        assert tuned.cap_poll_sleep(tuned.SUPERNODE_POLL_MODULE, 0.05)
        assert tuned.cap_poll_sleep(tuned.GRID_POLL_MODULE, 0.05)
        assert isinstance(node_mod.time, tuned.CappedSleepTime) and node_mod.time.cap == 0.05
        slept: list[float] = []
        with mock.patch.object(tuned._time, "sleep", slept.append):  # what the capped module really sleeps
            grid_mod.time.sleep(3)  # the hard-coded poll: capped
        assert slept == [0.05]
        assert grid_mod.time.time() == pytest.approx(time.time(), abs=1.0)  # everything else untouched
        # a module without the verified poll is left alone (e.g. another flwr version)
        assert not tuned.cap_poll_sleep("flwr.supercore.constant", 0.05)
    finally:
        grid_mod.time, node_mod.time = saved
    with pytest.raises(ValueError, match="--poll"):
        tuned.CappedSleepTime(0.0)


def test_fork_executor_launches_the_stock_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm executor forks a child that runs exactly the command Flower's executor would exec, and
    reaps it afterwards (no zombies)."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import subprocess_executor as se
    from flwr.supercore.superexec.executor.types import ExecutionSpec

    for name in ("launch", "reconcile"):  # restored after the test
        monkeypatch.setattr(se.SubprocessExecutor, name, getattr(se.SubprocessExecutor, name))
    monkeypatch.setattr(se, "subprocess", se.subprocess)
    record = tmp_path / "child.json"

    def fake_child(args: list[str], quiet: bool, poll: float | None) -> None:
        record.write_text(json.dumps({"args": args, "quiet": quiet, "poll": poll}))
        os._exit(0)

    monkeypatch.setattr(tuned, "_child", fake_child)
    pids: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(tuned.os, "fork", fork)
    assert tuned.install_fork_executor(poll=0.25)
    spec = ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:9094", token="tok",
                         insecure=True, root_certificates_path=None, runtime_dependency_install=False,
                         parent_pid=None, suppress_output=True, task_id=5)
    executor = se.SubprocessExecutor()
    assert executor.launch(spec).status == "accepted"
    assert len(pids) == 1
    deadline = time.time() + 20
    while not record.exists() or Path(f"/proc/{pids[0]}/stat").read_text().split()[2] != "Z":
        assert time.time() < deadline, "forked task process did not finish"
        time.sleep(0.05)
    assert json.loads(record.read_text()) == {
        "args": ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "tok", "--insecure"],
        "quiet": True, "poll": 0.25}
    executor.reconcile()
    with pytest.raises(ChildProcessError):  # already reaped by reconcile()
        os.waitpid(pids[0], os.WNOHANG)


# ============================================================================ fast: scripts, manifests
def _script(name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(DEPLOY / name)], env={**base, **env}, capture_output=True, text=True,
                          timeout=30)


def test_start_scripts_refuse_unsafe_or_incomplete_settings(tmp_path: Path) -> None:
    r = _script("supernode.sh", {})
    assert r.returncode != 0 and "NODE_CONFIG" in r.stderr
    r = _script("supernode.sh", {"NODE_CONFIG": "partition-id=0 num-partitions=2", "AUTH_KEY": "/k"})
    assert r.returncode == 2 and "needs TLS" in r.stderr
    r = _script("supernode.sh", {"NODE_CONFIG": "client-id=0", "CA_CERT": str(tmp_path / "nope.crt")})
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _script("superlink.sh", {"NODE_AUTH": "1"})
    assert r.returncode == 2 and "needs TLS" in r.stderr
    r = _script("superlink.sh", {"CERTS_DIR": str(tmp_path)})
    assert r.returncode == 2 and "is missing" in r.stderr
    # both always run with the installed environment (no per-run `uv sync`)
    assert "--disable-runtime-dependency-installation" in (DEPLOY / "superlink.sh").read_text()
    assert "--allow-runtime-dependency-installation" not in (DEPLOY / "supernode.sh").read_text()


def test_compose_files_describe_a_consistent_federation() -> None:
    """Node identities and key wiring; exposure and hardening: tests/test_deploy_security.py."""
    services = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())["services"]
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert nodes == ["supernode-0", "supernode-1", "supernode-2"]
    ids = []
    for name in nodes:
        env = services[name]["environment"]
        assert env["SUPERLINK"] == "superlink:9093"  # the proxy's Fleet listener
        ids.append(int(re.search(r"partition-id=(\d+)", env["NODE_CONFIG"]).group(1)))
        assert "num-partitions=3" in env["NODE_CONFIG"] and "state-dir='/state'" in env["NODE_CONFIG"]
        assert services[name]["build"]["target"] == "supernode"
        # TLS + node auth: the CA + this node's own key, nothing else
        assert (env["CA_CERT"], env["AUTH_KEY"]) == ("/certs/ca.crt", "/certs/supernode.key")
        assert f"./certs/keys/supernode-{name[-1]}:/certs/supernode.key:ro" in services[name]["volumes"]
        assert not any("server.key" in v or "ca.key" in v for v in services[name]["volumes"])
    assert ids == [0, 1, 2]
    assert services["superlink"]["build"]["target"] == "superlink"
    link_env = services["superlink"]["environment"]
    assert (link_env["CERTS_DIR"], link_env["NODE_AUTH"]) == ("/certs", "1")


def test_dockerfile_targets_and_copied_paths_exist() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^FROM .* AS (\w+)$", text, re.M) == ["base", "superlink", "supernode", "proxy"]
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / src).exists(), src
    entries = re.findall(r'^ENTRYPOINT \["/usr/bin/tini", "--", "(/app/[^"]+)"\]', text, re.M)
    assert len(entries) == 3
    for entry in entries:
        path = ROOT / entry.removeprefix("/app/")
        assert path.exists() and os.access(path, os.X_OK), entry
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in text
    assert "USER 10001:10001" in text


def test_kubernetes_manifests_wire_identity_data_and_secrets() -> None:
    k8s = DEPLOY / "k8s"
    docs, kust = load_kustomization(k8s)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "superlink"), ("Service", "superlink"), ("StatefulSet", "supernode")} <= kinds
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert names.index("POD_INDEX") < names.index("NODE_CONFIG")  # $(POD_INDEX) is expanded in order
    assert env["NODE_CONFIG"]["value"] == ("client-id=$(POD_INDEX) data-path='/data/client-$(POD_INDEX).npz' "
                                           "state-dir='/state'")
    # the SuperNode container holds only its own key: an init container copies supernode-<pod index> out of
    # the fleet's key secret into a memory volume, which is all the SuperNode container mounts
    assert env["AUTH_KEY"]["value"] == "/key/supernode.key"
    [init] = pod["initContainers"]
    # install replaces a key left by an earlier start (the memory volume outlives a pod's restart; cp onto the
    # 0400 copy failed with "Permission denied" when podman re-ran the init container)
    assert init["command"] == ["install", "-m", "0400", "/all-keys/supernode-$(POD_INDEX)", "/key/supernode.key"]
    assert {m["name"] for m in init["volumeMounts"]} == {"keys", "own-key"}
    main_mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert "keys" not in main_mounts and main_mounts["own-key"]["readOnly"] is True
    assert {v["name"]: v for v in pod["volumes"]}["own-key"]["emptyDir"]["medium"] == "Memory"
    assert init["securityContext"]["readOnlyRootFilesystem"] is True and init["resources"]["limits"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["ca"]["secret"]["secretName"] == "federation-ca"
    secrets = {s["name"]: s["files"] for s in kust["secretGenerator"]}
    assert secrets["federation-ca"] == ["ca.crt=certs/ca.crt"]
    assert all("ca.key" not in f for files in secrets.values() for f in files)
    assert len(secrets["supernode-keys"]) == sts["spec"]["replicas"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate" and deployment["spec"]["replicas"] == 1
    link = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "superlink")
    link_env = {e["name"]: e["value"] for e in link["env"]}
    assert link_env["NODE_AUTH"] == "1" and link_env["CERTS_DIR"] == "/certs"


# ============================================================================ slow: real processes
def _assert_clean_rounds(doc: dict, rounds: int, clients: list[int]) -> None:
    assert [r["round"] for r in doc["rounds"]] == list(range(1, rounds + 1))
    for r in doc["rounds"]:
        assert r["sampled"] == clients and r["num_updates"] == len(clients) and r["failures"] == []


COMMON = {"dataset": "digits", "partition": "dirichlet", "seed": 1}
GOOD, UNREGISTERED, BAD = [0, 1, 2], 3, 4  # the shared federation's nodes (see node_local_fed)
# the node-failure test's: each round waits this long for the killed node. Live FedAvg rounds of this federation
# took 3-7 s at load 4-6 with the SuperLink's SQLite store (15 s then); with its in-memory state half of that
# (train-only rounds 1-2 s at load 1-2).
ROUND_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def node_local_fed(tmp_path_factory: pytest.TempPathFactory):
    """One loopback federation for every slow test of this module (each used to start its own): a SuperLink
    with TLS, SuperNode authentication and TUNED mode (SuperExec secret), and five SuperNodes:

    - 0, 1, 2 (registered): each reads its own .npz (client-id + data-path; a local test split of 25% for the
      federated evaluation) and persists client state to its own state-dir;
    - 3 (key never registered): refused at activation (the TLS / authentication test); started as a stock
      SuperNode (its refusal does not depend on the mode, and it never runs a ClientApp: no SuperExec
      preloading torch for nothing while the others start);
    - 4 (key registered and node started only by the node-failure test): its data-path does not exist, so
      its ClientApp raises on every message.

    The SuperLink keeps its state in memory (superlink.sh without DATABASE; nothing here restarts it): its
    SQLite file store doubled the federation's CPU per round (measured: a FedUFO round 7.5 s -> 4.2 s).

    Order matters and is the file's: authentication, the runs, then the node-failure test (node 4 stopped
    gracefully, node 2 killed), last. Every process is stopped at the end, also after failures."""
    tmp = tmp_path_factory.mktemp("node-local-fed")
    write_node_files(tmp / "node-data", 3, {**COMMON, "local-test-fraction": 0.25})
    node_cfg = [f"client-id={i} data-path='{tmp / 'node-data' / f'client-{i}.npz'}' "
                f"state-dir='{tmp / f'state-{i}'}'" for i in GOOD]
    node_cfg.append(f"client-id=0 data-path='{tmp / 'node-data' / 'client-0.npz'}'")     # 3: unregistered
    node_cfg.append(f"client-id=3 data-path='{tmp / 'node-data' / 'missing.npz'}'")      # 4: raises
    fed = LocalFederation(tmp / "fed", 5, tls=True, node_auth=True, register=GOOD, start_nodes=GOOD, tuned=True,
                          node_configs=node_cfg, app_dir=snapshot_app(tmp / "app"), database=False)
    try:
        fed.start()
        fed.start_node(UNREGISTERED, tuned=False, ACTIVATION_PATIENCE="0")   # exits at its refusal
        fed.wait_connected(GOOD)
        yield fed, tmp
    finally:
        fed.stop()
        assert not any(p.alive() for p in [fed.superlink, *fed.nodes.values()])


@pytest.mark.slow
def test_tls_with_supernode_authentication_refuses_unregistered_node(node_local_fed) -> None:
    """The unregistered node is refused and only the registered ones are online. That runs over this TLS +
    authentication federation sample exactly the registered nodes is asserted by every run below."""
    fed, tmp = node_local_fed
    # the unregistered node is turned away at activation and exits (Flower exit code 305)
    fed.nodes[UNREGISTERED].popen.wait(timeout=120)
    log3 = fed.nodes[UNREGISTERED].log.read_text(errors="replace")
    assert fed.nodes[UNREGISTERED].popen.returncode != 0
    assert "Failed to activate SuperNode" in log3 and "SuperNode ID:" not in log3
    link_log = fed.superlink.log.read_text(errors="replace")
    assert "No SuperNode found with the given public key" in link_log
    assert "SuperExec authentication is experimental" in link_log  # SUPEREXEC_SECRET_FILE is in use
    listing = fed.flwr("supernode", "list", "localfed", "--format", "json")
    nodes = json.loads(listing.stdout)["nodes"]
    assert sorted(n["status"] for n in nodes) == ["online"] * len(GOOD), listing.stdout
    # a plain-HTTP client cannot talk to the TLS SuperLink
    write_connection("plain", f"127.0.0.1:{fed.port}", home=fed.home)
    assert fed.flwr("list", "plain", timeout=120).returncode != 0


@pytest.mark.slow
def test_flwr_run_refuses_in_the_server_app_before_round_1(node_local_fed) -> None:
    """`flwr run` with a config the declarations accept but the pre-flight does not (vgg11 on 8x8 digits):
    the ServerApp refuses at its start, naming the key in the streamed log; Flower marks the run failed, no
    round runs, no out-dir is written. (It was checked in tests/test_cli_runs.py with `flwr run . local` on
    a simulation SuperLink of its own, which then starts and stops Ray even after the ServerApp refused:
    ~20 s for the same ServerApp code path. `flwr run . local` end to end: run_local.sh's test there.)"""
    fed, tmp = node_local_fed
    res = fed.run({**COMMON, "method": "fedavg", "num-server-rounds": 2, "model": "vgg11",
                   "out-dir": str(tmp / "refused")}, timeout=300, name="refused")
    assert "noniid-fl: refused before round 1: run-config key 'model' got 'vgg11'" in res.output, res.output[-3000:]
    assert res.status == "finished:failed", res.status
    assert "[round " not in res.output and not (tmp / "refused").exists()


@pytest.mark.slow
def test_deployment_runs_fedufo_with_federated_evaluation_on_node_local_data(node_local_fed) -> None:
    """Two rounds of FedUFO (train.prior / train.posterior relay, client state across messages and rounds) with
    federated evaluation on each node's local test split, via `flwr run`. (FedAvg on this federation: the
    node-failure run below; a clean FedAvg round on a deployment: tests/test_deploy_security.py. A FedAvg round
    of its own here cost a run start, ~8 s, for what this run asserts too.)"""
    fed, tmp = node_local_fed
    ufo = fed.run({**COMMON, "method": "fedufo", "num-server-rounds": 2, "out-dir": str(tmp / "ufo"),
                   "round-timeout": 120.0, "local-test-fraction": 0.25, "federated-eval-every": 1},
                  timeout=300, name="fedufo")
    assert ufo.status == "finished:completed", ufo.output[-3000:]
    _assert_clean_rounds(ufo.doc, 2, GOOD)  # the unregistered nodes took no part
    # federated evaluation answered in both rounds, from every node
    assert all(r["client_accuracy_mean"] is not None and len(r["per_client"]) == len(GOOD) for r in ufo.doc["rounds"])
    assert ufo.doc["final"]["global_accuracy"] > 0.2  # 10 classes: chance is 0.1
    assert (tmp / "ufo" / "checkpoint.pt").exists()
    # train.prior and train.posterior reached every node in both rounds, and each posterior found the
    # prior that the SuperNode kept in context.state between the two ClientApp processes
    logs = "".join(fed.nodes[i].log.read_text(errors="replace") for i in GOOD)
    assert logs.count("Receiving: train.prior message") == 6
    assert logs.count("Receiving: train.posterior message") == 6
    assert logs.count("Receiving: evaluate message") == 6
    assert "not in client state" not in logs
    # node-config state-dir: client state persisted on each node's disk, per run and round (client_app/state.py)
    for i in GOOD:
        assert list((tmp / f"state-{i}").glob(f"run-*/client-{i}/r000002-*.pt"))


@pytest.mark.slow
def test_failing_and_killed_nodes_are_recorded_and_the_run_finishes_with_the_rest(node_local_fed) -> None:
    """Two node failures in one run (they used to be a run each), both recorded while nodes 0 and 1 train
    both rounds:

    - node 4 (its key registered now; its node-config points at a data file that does not exist): its
      ClientApp raises on every message, so its registration fails with the reason; it is asked again with
      back-off (at start-up and in round 1, round 2 skipped) and never sampled;
    - node 2: SIGKILLed (with its SuperExec and ClientApp) while it trains in round 1 (CI variant of the
      node-loss story). round-timeout (10 s: ~3x a live round of this federation on a loaded 2-core box)
      is far below Flower's ~60 s heartbeat expiry, so round 1 records a 'timeout'; in round 2 it is a
      'timeout' again or, should Flower have expired the node by then, 'node-lost'.

    Node 4 is stopped gracefully afterwards: it deactivates itself, and the SuperLink no longer lists it
    online. deploy/node_loss_trial.py runs the longer story (node expired, 'node-lost', restarted, back
    with its state-dir)."""
    fed, tmp = node_local_fed
    out = tmp / "failing-nodes"
    cfg = {**COMMON, "method": "fedavg", "num-server-rounds": 2, "federated-eval-every": 0, "min-train-nodes": 2,
           "round-timeout": ROUND_TIMEOUT, "min-train-replies": 1, "out-dir": str(out)}
    fed.register_node(BAD)
    fed.start_node(BAD)
    try:
        fed.wait_connected([BAD], superexec=True)  # its ClientApp then fails at once, not by round-timeout
        bad_id = re.search(r"SuperNode ID: (\d+)", fed.nodes[BAD].log.read_text(errors="replace")).group(1)
        seen = fed.nodes[2].log.read_text(errors="replace").count("Receiving: train message")
        started = time.time()
        popen = fed.submit(cfg, name="failing-nodes")
        while fed.nodes[2].log.read_text(errors="replace").count("Receiving: train message") == seen:
            assert time.time() < started + 300 and popen.poll() is None, \
                (fed.logs / "failing-nodes.out").read_text()[-3000:]
            time.sleep(0.02)
        fed.kill_node(2, signal.SIGKILL)
        assert not fed.nodes[2].alive()
        res = fed.finish(popen, cfg, "failing-nodes", started, timeout=400)
    finally:  # stopped gracefully: it deactivates itself
        fed.nodes[BAD].signal_group(signal.SIGTERM)
        fed.nodes[BAD].popen.wait(timeout=60)
    assert res.status == "finished:completed", res.output[-3000:]
    rounds = res.doc["rounds"]
    assert [r["sampled"] for r in rounds] == [GOOD, GOOD] and all(r["num_updates"] == 2 for r in rounds)
    # node 4: registration failed with the reason at start-up and in round 1; round 2 skipped by the back-off
    register = [f for r in rounds for f in r["failures"] if f["phase"] == "register"]
    assert len(register) == 2 and all(f["kind"] == "error" and "missing.npz" in f["reason"] for f in register)
    # node 2: one train failure per round, nothing else
    for r in rounds:
        lost = [f for f in r["failures"] if f["phase"] != "register"]
        assert [(f["cid"], f["phase"]) for f in lost] == [(2, "train")]
        assert lost[0]["kind"] in ("timeout", "node-lost")
        if lost[0]["kind"] == "timeout":  # it waited for the dead node up to round-timeout
            assert r["wall_time_s"] >= ROUND_TIMEOUT - 1.0
        else:  # Flower expired the node (no heartbeat for ~60 s) and the SuperLink answered for it
            assert "Node Unavailable" in lost[0]["reason"]
    first = [f for f in rounds[0]["failures"] if f["phase"] == "train"]
    assert first[0]["kind"] == "timeout"  # killed seconds ago: not yet expired
    assert json.loads((out / "results.json").read_text())["final"]["global_accuracy"] > 0.1
    deadline = time.time() + 60
    while True:  # the SuperLink lists node 4, no longer online
        listing = json.loads(fed.flwr("supernode", "list", "localfed", "--format", "json").stdout)["nodes"]
        if [n["status"] for n in listing if n["node-id"] == bad_id] == ["offline"]:
            break
        assert time.time() < deadline, listing
        time.sleep(1)
