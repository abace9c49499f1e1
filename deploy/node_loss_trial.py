"""What happens when a SuperNode dies mid-run, end to end (too slow for CI: Flower needs ~60 s of missed
heartbeats before it declares a node dead).

    nice -n 10 python -m deploy.node_loss_trial [--rounds 5] [--method scaffold] [--stock]

A SuperLink and 3 SuperNodes on loopback (partition-id demo data, node-config state-dir); the run has
round-timeout 150 s (> the heartbeat expiry). While node 2 trains in round 2 it is SIGKILLed together with
its SuperExec and ClientApp; as soon as round 2 is over it is restarted (same node config and state-dir,
so its client state is read back from disk) and rejoins at the next round's registration step. Prints one line per round from results.json: who was
sampled, how many updates were aggregated, the failures (client, phase, kind, reason) and the wall time,
plus when the failure arrived relative to the kill.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

from deploy.localfed import LocalFederation, snapshot_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--method", default="scaffold")
    parser.add_argument("--stock", action="store_true", help="stock Flower processes instead of TUNED=1")
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="node-loss-"))
    node_cfg = [f"partition-id={i} num-partitions=3 state-dir='{work / f'state-{i}'}'" for i in range(3)]
    cfg = {"method": ns.method, "dataset": "digits", "num-server-rounds": ns.rounds, "federated-eval-every": 0,
           "round-timeout": 150.0, "min-train-replies": 1, "out-dir": str(work / "out")}
    fed = LocalFederation(work / "fed", 3, tuned=not ns.stock, node_configs=node_cfg,
                          app_dir=snapshot_app(work / "app"))
    try:
        fed.start()
        fed.wait_connected()
        started = time.time()
        popen = fed.submit(cfg, name="trial")
        out = fed.logs / "trial.out"
        node2 = fed.nodes[2].log
        # wait until node 2 has received its round-2 training message, then kill it
        while node2.read_text(errors="replace").count("Receiving: train message") < 2:
            if popen.poll() is not None or time.time() - started > 1200:
                raise SystemExit(f"run ended before round 2 reached node 2:\n{out.read_text()[-3000:]}")
            time.sleep(0.02)
        fed.kill_node(2, signal.SIGKILL)
        killed = time.time()
        print(f"killed supernode-2 at t={killed - started:.1f}s (while training in round 2)", flush=True)
        while "[round 2/" not in out.read_text(errors="replace"):
            if popen.poll() is not None:
                break
            time.sleep(0.2)
        print(f"round 2 finished {time.time() - killed:.1f}s after the kill", flush=True)
        fed.start_node(2)
        print(f"restarted supernode-2 at t={time.time() - started:.1f}s (same node config and state-dir)", flush=True)
        while node2.read_text(errors="replace").count("SuperNode ID:") < 2 and popen.poll() is None:
            time.sleep(0.2)
        print(f"supernode-2 connected again at t={time.time() - started:.1f}s", flush=True)
        res = fed.finish(popen, cfg, "trial", started, timeout=1800)
    finally:
        fed.stop()
    print(f"run {res.run_id}: {res.status} after {res.wall_s:.1f}s; logs in {fed.logs}")
    if res.doc is None:
        print(res.output[-3000:])
        return
    for r in res.doc["rounds"]:
        fails = "; ".join(f"client {f['cid']} {f['phase']} {f['kind']} ({f['reason'][:80]})" for f in r["failures"])
        print(f"round {r['round']}: sampled {r['sampled']}, {r['num_updates']} updates, "
              f"{r['wall_time_s']:.1f}s, G-FL {r['global_accuracy']:.3f}" + (f" | failures: {fails}" if fails else ""))
    state = sorted((work / "state-2").glob("run-*/client-2/r*.pt"))  # per run and round (client_app/state.py)
    print(f"node 2 client state files: {', '.join(p.name for p in state) or 'missing'} in {work / 'state-2'}")


if __name__ == "__main__":
    main()
