"""Does a preset learn at its stated values? A short run of each (few rounds, local steps capped), on the
in-process grid, with what it rejected (issue 31 item 3: the FMNIST presets; docs/PRESETS.md cites the result).

    python -m benchmarks.preset_check PRESET [--rounds R] [--steps S] [--variant "key=value ..."] ...

Each variant is the preset with those keys changed (the first run is always the preset as stated). Results are
merged into benchmarks/results/preset_check.json under "<preset> | <variant>", with the budget, per-round G-FL
accuracy, the updates kept and the rejections by kind, the CPU seconds and the load at the start.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

from benchmarks.harness import RESULTS_DIR, parser
from flcore.presets import get_preset

OUT = RESULTS_DIR / "preset_check.json"


def parse_variant(text: str) -> dict[str, Any]:
    """``"key=value ..."`` in `flwr run -c` syntax (strings quoted) -> overrides."""
    from flwr.common.config import parse_config_args

    return dict(parse_config_args([text])) if text else {}


def kind(reason: str) -> str:
    if "NaN or Inf" in reason:
        return "nan"
    if "max-update-norm" in reason:
        return "max-update-norm"
    if "update-norm-factor" in reason:
        return "update-norm-factor"
    return "other"


def check(name: str, variant: dict[str, Any], rounds: int, steps: int) -> dict[str, Any]:
    from engines.grid import InProcessGrid
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import run_federation

    preset = get_preset(name)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        values = {"preset": name, **variant, "num-server-rounds": rounds, "max-local-steps": steps,
                  "checkpoint": False, "out-dir": tmp}
        cfg = RunConfig.from_dict(resolve_run_config(values))
        t0 = time.process_time()
        doc = run_federation(InProcessGrid(preset.num_supernodes), cfg)
        cpu = time.process_time() - t0
    per_round = []
    for row in doc["rounds"]:
        kinds: dict[str, int] = {}
        for f in row.get("failures", []):
            if f.get("kind") == "rejected":
                kinds[kind(f["reason"])] = kinds.get(kind(f["reason"]), 0) + 1
        per_round.append({"round": row["round"], "global_accuracy": row.get("global_accuracy"),
                          "local_accuracy": row.get("local_accuracy"), "updates": row["num_updates"],
                          "sampled": row["num_sampled"], "rejected": kinds})
    return {"preset": name, "variant": variant, "clients": preset.num_supernodes,
            "budget": {"num-server-rounds": rounds, "max-local-steps": steps},
            "values": {k: cfg.value(k) for k in ("method", "lr", "momentum", "weight-decay", "batch-size", "local-epochs",
                                            "model", "dataset", "dirichlet-alpha")},
            "rounds": per_round, "cpu_s": round(cpu, 1), "load_at_start": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, summary=True)
    ap.add_argument("preset")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="max-local-steps of every client")
    ap.add_argument("--variant", action="append", default=[], help='"key=value ..." changed from the preset')
    ap.add_argument("--skip-stated", action="store_true", help="run only the variants")
    args = ap.parse_args(argv)
    doc = json.loads(OUT.read_text()) if OUT.exists() else {}
    variants = ([] if args.skip_stated else [""]) + args.variant
    for text in variants:
        res = check(args.preset, parse_variant(text), args.rounds, args.steps)
        key = f"{args.preset} | {text or 'as stated'}"
        doc[key] = res
        OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        accs = [r["global_accuracy"] for r in res["rounds"]]
        rej = [r["rejected"] for r in res["rounds"]]
        print(f"{key}: G-FL {accs}, rejected {rej}, {res['cpu_s']} s CPU (load {res['load_at_start']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
