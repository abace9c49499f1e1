"""False rejections of the relative update screen (``update-norm-factor``) on honest federations (issue 31
item 8).

Each setting runs once with the relative screen off (``update-norm-factor = 0``: every honest update is
aggregated, the honest trajectory) on the in-process grid, and records every accepted update's norm
``||theta_k - theta||``, registered sample count and reported local steps, round by round. The screens are
then applied to those rounds offline: the old one (``update-norm-factor`` x the round's median norm, the
rule before this change) and the shipped one (:func:`strategies.update_screen.relative_screen`, the same
median scaled per client by the local steps its registered samples allow). No client misbehaves, so
every rejection is a false one. NaN/Inf or absolute-norm rejections (which the relative screen does not
decide) are counted apart from the recorded failures.

    python -m benchmarks.screen_rejections [--only NAME ...] [--rounds R]   # writes results/screen_rejections.json

Settings: Fashion-MNIST Dir(0.1), 20 clients, ConvNet, FedAvg with every default (full local epochs), and each
claims-ledger experiment (experiments/configs/claim-*.toml) at its shrunk setting: every run label at every
lr of its tuning grid, seed 0. ``--replay`` re-runs, from its own recorded run config, every committed run
under results/ that the old screen rejected an update in (results.json failures "exceeds update-norm-factor"),
so the old rule's count there is checked against what was recorded and the shipped rule's measured on the same
federations.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import tomllib
from typing import Any

from benchmarks.harness import RESULTS_DIR, parser
from flcore.config import PROJECT_ROOT, RunConfig, resolve_run_config

OUT = RESULTS_DIR / "screen_rejections.json"
CONFIGS = PROJECT_ROOT / "experiments" / "configs"
RECORDED: dict[str, int] = {}  # replayed run -> the old screen's rejections its results.json recorded
FMNIST = {"dataset": "fmnist", "partition": "dirichlet", "dirichlet-alpha": 0.1, "method": "fedavg"}


def settings(rounds: int | None, seeds: list[int]) -> dict[str, tuple[dict[str, Any], int]]:
    """name -> (run-config overrides, number of clients)."""
    out = {f"fmnist-dir01-fedavg-defaults/seed{s}": ({**FMNIST, "num-server-rounds": rounds or 3, "seed": s}, 20)
           for s in seeds}
    for path in sorted(CONFIGS.glob("claim-*.toml")):
        doc = tomllib.loads(path.read_text())
        from flwr.common.config import flatten_dict

        base, runs = flatten_dict(doc.get("base", {})), doc["runs"]
        grid = doc.get("tuning", {}).get("lr") or [None]
        for label, over in runs.items():
            for lr in grid:
                cfg = {**base, **flatten_dict(over), **({"lr": lr} if lr is not None else {})}
                if rounds:
                    cfg["num-server-rounds"] = min(rounds, int(cfg.get("num-server-rounds", 10)))
                name = f"{doc['experiment']['name']}/{label}/lr={lr}"
                out[name] = (cfg, int(doc["experiment"]["num-supernodes"]))
    return out


def replay_settings(rounds: int | None) -> dict[str, tuple[dict[str, Any], int]]:
    """results/<...>/results.json -> (its recorded run config, its number of clients), for every committed run
    with a rejection by the old relative screen."""
    from experiments.legacy import current_run_config

    out = {}
    for path in sorted((PROJECT_ROOT / "results").glob("**/results.json")):
        doc = json.loads(path.read_text())
        hits = sum("update-norm-factor" in f.get("reason", "") for r in doc.get("rounds", [])
                   for f in r.get("failures", []))
        if not hits:
            continue
        cfg = current_run_config(doc["run_config"], str(path))
        cfg = {k: v for k, v in cfg.items() if k not in ("out-dir", "resume-from", "overwrite", "client-state-dir")}
        cfg["update-norm-scale"] = "none"  # irrelevant with the screen off; recorded under the old rule
        if rounds:
            cfg["num-server-rounds"] = min(rounds, int(cfg["num-server-rounds"]))
        name = f"replay:{path.parent.relative_to(PROJECT_ROOT)}"
        RECORDED[name] = hits
        out[name] = (cfg, int(doc["final"]["num_clients"]))
    return out


def record(overrides: dict[str, Any], nodes: int) -> dict[str, Any]:
    """Run one honest federation with the relative screen off; every round's updates (norm, samples,
    reported steps) and the failures the run recorded."""
    from engines.grid import InProcessGrid
    from server_app.runner import run_federation
    from strategies.aggregation import deltas, flat_norm
    from strategies.update_checks import UpdateChecks

    seen: list[list[dict[str, Any]]] = []
    original = UpdateChecks.screen

    def recording(self, server_round, updates, reference, rejected, phase, norms=None):  # noqa: ANN001
        row = []
        for u in updates:
            n = (norms or {}).get(u.cid)
            norm = n.exact() if n is not None else flat_norm(deltas(reference, u.params))
            row.append({"cid": u.cid, "norm": norm, "samples": u.num_examples,
                        "steps": int(u.metrics.get("local-steps", -1)), "phase": phase})
        seen.append(row)
        return original(self, server_round, updates, reference, rejected, phase, norms)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.from_dict(resolve_run_config({"seed": 0, **overrides, "update-norm-factor": 0.0,
                                                      "checkpoint": False, "out-dir": tmp}))
        UpdateChecks.screen = recording
        t0 = time.process_time()
        try:
            doc = run_federation(InProcessGrid(nodes), cfg)
        finally:
            UpdateChecks.screen = original
        cpu = time.process_time() - t0
    failures = [f for r in doc["rounds"] for f in r.get("failures", [])]
    final = doc["rounds"][-1].get("global_accuracy")
    return {"config": {k: cfg.value(k) for k in sorted(overrides)}, "nodes": nodes, "updates": seen,
            "other_failures": [f"{f['cid']}: {f['reason']}" for f in failures], "final_accuracy": final,
            "cpu_s": round(cpu, 1), "run": {k: cfg.value(k) for k in
                                             ("local-epochs", "batch-size", "max-local-steps", "momentum")}}


def rejected(rows: list[list[dict[str, Any]]], run: dict[str, Any], factor: float, rule: str) -> list[dict]:
    """The updates ``rule`` ('old' or 'shipped') would reject in the recorded rounds."""
    from strategies.update_screen import relative_screen

    out = []
    for row in rows:
        if len(row) < 3:
            continue
        norms = [u["norm"] for u in row]
        if rule == "old":
            scales = [1.0] * len(row)
        else:
            scales = [expected_scale(u["samples"], run) for u in row]
        for u, (bad, limit) in zip(row, relative_screen(norms, scales, factor)):
            if bad:
                out.append({"cid": u["cid"], "norm": round(u["norm"], 4), "limit": round(limit, 4),
                            "samples": u["samples"], "steps": u["steps"]})
    return out


def expected_scale(samples: int, run: dict[str, Any]) -> float:
    from strategies.update_screen import step_scale

    return step_scale(samples, run["local-epochs"], run["batch-size"], run["max-local-steps"], run["momentum"])


def worst_ratio(rows: list[list[dict[str, Any]]], run: dict[str, Any], rule: str) -> float:
    """The largest norm / (its limit / factor) over the recorded updates: how many times the round's (scaled)
    median the most extreme update reached; a rule rejects it when this exceeds update-norm-factor."""
    from strategies.update_screen import relative_limits

    worst = 0.0
    for row in rows:
        if len(row) < 3:
            continue
        norms = [u["norm"] for u in row]
        scales = [1.0] * len(row) if rule == "old" else [expected_scale(u["samples"], run) for u in row]
        worst = max([worst] + [n / lim for n, lim in zip(norms, relative_limits(norms, scales, 1.0)) if lim > 0])
    return round(worst, 2)


def summarise(rec: dict[str, Any], factor: float) -> dict[str, Any]:
    total = sum(len(r) for r in rec["updates"])
    old, new = (rejected(rec["updates"], rec["run"], factor, rule) for rule in ("old", "shipped"))
    return {"updates": total, "old_rejections": len(old), "shipped_rejections": len(new),
            "worst_old_ratio": worst_ratio(rec["updates"], rec["run"], "old"),
            "worst_shipped_ratio": worst_ratio(rec["updates"], rec["run"], "shipped"),
            "old_rejected": old[:20], "shipped_rejected": new[:20]}


GROUPS = {"fmnist": "Fashion-MNIST Dir(0.1), 20 clients, FedAvg with every default",
          "claim": "the claims ledger's settings (seed 0, every lr of each tuning grid)",
          "replay": "re-runs of the committed runs the old screen rejected in"}


def group_of(name: str) -> str:
    return next(g for g in GROUPS if name.startswith(g))


def totals(settings_: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per group (:data:`GROUPS`): runs, updates, and the old and shipped screens' rejections."""
    out: dict[str, dict[str, int]] = {}
    for name, rec in settings_.items():
        t = out.setdefault(group_of(name), {"runs": 0, "updates": 0, "old_rejections": 0, "shipped_rejections": 0})
        t["runs"] += 1
        for k in ("updates", "old_rejections", "shipped_rejections"):
            t[k] += rec["screen"][k]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--only", nargs="*", help="setting names (or prefixes) to run")
    ap.add_argument("--rounds", type=int, help="cap on rounds per setting (default: the setting's own)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0], help="seeds of the Fashion-MNIST setting")
    ap.add_argument("--replay", action="store_true", help="re-run the committed runs the old screen rejected in")
    args = ap.parse_args(argv)
    table = replay_settings(args.rounds) if args.replay else settings(args.rounds, args.seeds)
    chosen = [n for n in table if not args.only or any(n.startswith(p) for p in args.only)]
    doc = json.loads(OUT.read_text()) if OUT.exists() else {"settings": {}}
    factor = RunConfig.from_dict(resolve_run_config({})).update_norm_factor
    for name in chosen:
        overrides, nodes = table[name]
        rec = record(overrides, nodes)
        rec["screen"] = summarise(rec, factor)
        if name in RECORDED:
            rec["screen"]["recorded_old_rejections"] = RECORDED[name]
        doc["settings"][name] = rec
        s = rec["screen"]
        print(f"{name}: {s['updates']} updates, rejected old {s['old_rejections']} / shipped "
              f"{s['shipped_rejections']} (recorded {s.get('recorded_old_rejections', '-')}), other failures {len(rec['other_failures'])}, "
              f"final acc {rec['final_accuracy']}, {rec['cpu_s']} s CPU", flush=True)
        doc["factor"] = factor
        doc["totals"] = totals(doc["settings"])
        OUT.write_text(json.dumps(doc, indent=1, default=lambda x: None if isinstance(x, float) and
                                  not math.isfinite(x) else x) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
