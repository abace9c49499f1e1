"""Generate docs/RESULTS.md (tables, mean ± std over seeds) and figures from results/*/ files.

    python -m experiments.report            # all experiments under results/
    python -m experiments.report --ledger-only   # only the claims ledger section of the existing RESULTS.md
    python -m experiments.report --ledger-only --experiments claim-fedbc-synthetic ...   # and those sections
Nothing in RESULTS.md is typed by hand: every number comes from a results.json.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from experiments.claims import CLAIMS, ledger_for
from experiments.legacy import current_run_config
from experiments.near_ties import checked_on
from experiments.paired import paired_table, versus_best_table
from flcore.config import PROJECT_ROOT
from flcore.stack import describe
from server_app.results import recorded_target, summarize

RESULTS_ROOT = PROJECT_ROOT / "results"
DOC = PROJECT_ROOT / "docs" / "RESULTS.md"
FIG_DIR = PROJECT_ROOT / "docs" / "figures"
HEADER = PROJECT_ROOT / "docs" / "templates" / "RESULTS_header.md"  # the report's prose lives in docs/templates

COLUMNS = [  # (header, key in "final", scale, decimals)
    ("G-FL acc", "global_accuracy", 100, 2),
    ("best G-FL", "best_global_accuracy", 100, 2),
    ("P-FL acc", "local_accuracy", 100, 2),
    ("P-FL all devices", "local_accuracy_all_devices", 100, 2),  # each device's last local model (runner.py)
    ("clients: worst", "client_accuracy_worst", 100, 2),
    ("clients: std", "client_accuracy_std", 100, 2),
    ("min-data client", "min_data_client_accuracy", 100, 2),
    ("max-data client", "max_data_client_accuracy", 100, 2),
    ("rounds to target", "rounds_to_target", 1, 1),
    ("s/round", "mean_round_time_s", 1, 2),
    ("failed updates", "total_failures", 1, 1),  # rejected by the update checks, or lost (item 8 of issue 31)
]


def mean_std(values: list[float | None], scale: float, decimals: int) -> str:
    vals = [v * scale for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "–"
    missing = len(values) - len(vals)
    text = f"{np.mean(vals):.{decimals}f} ± {np.std(vals, ddof=1):.{decimals}f}" if len(vals) > 1 else f"{vals[0]:.{decimals}f}"
    return text + (f" ({missing} never)" if missing else "")


def load_runs(exp_dir: Path, unfinished: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each run label's results.json documents; finished runs only, unless ``unfinished`` (for an experiment read
    at fixed rounds: ``report-rounds``)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for label_dir in sorted(p for p in exp_dir.iterdir() if p.is_dir()):
        docs = []
        for seed_dir in sorted(label_dir.glob("seed*")):
            f = seed_dir / "results.json"
            if f.exists():
                doc = json.loads(f.read_text())
                # runs recorded before issue 16 name method keys the old flat way: read them under today's names
                doc["run_config"] = current_run_config(doc["run_config"], str(f))
                if unfinished or len(doc["rounds"]) >= int(doc["run_config"].get("num-server-rounds", 0)):
                    docs.append(doc)  # unfinished runs (in progress or killed) stay out of the tables
        if docs:
            runs[label_dir.name] = docs
    return runs


def at_round(runs: dict[str, list[dict[str, Any]]], n: int) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The runs read at round ``n``: each document cut to its first ``n`` rounds with "final" recomputed over
    them (server_app.results.summarize), for the runs that reached round ``n``; and a note per label whose
    runs did not (how far each got, its time per round)."""
    cut: dict[str, list[dict[str, Any]]] = {}
    short: list[str] = []
    for label, docs in runs.items():
        kept = [{**d, "rounds": d["rounds"][:n],
                 "final": summarize(d["rounds"][:n], recorded_target(d["run_config"]),
                                    d["final"].get("num_clients", 0))}
                for d in docs if len(d["rounds"]) >= n]
        if kept:
            cut[label] = kept
        for d in docs:
            if len(d["rounds"]) < n:
                secs = summarize(d["rounds"], recorded_target(d["run_config"])).get("mean_round_time_s")
                short.append(f"{label} (seed {d['run_config'].get('seed')}): {len(d['rounds'])} round(s)"
                             + (f", {secs:.0f} s/round" if secs is not None else ""))
    return cut, short


def stopping_rounds(runs: dict[str, list[dict[str, Any]]], most: int = 3) -> list[int]:
    """The rounds to read an experiment stopped early at: where its unfinished runs stopped (each a round every
    run still in that table reached), the ``most`` earliest; [] when every run finished."""
    stops = sorted({len(d["rounds"]) for docs in runs.values() for d in docs
                    if 0 < len(d["rounds"]) < int(d["run_config"].get("num-server-rounds", 0))})
    return stops[:most]


def mark_stopped(exp_dir: Path, note: str = "") -> list[int]:
    """Write ``report-rounds`` (:func:`stopping_rounds`) into ``exp_dir/experiment.toml``'s [experiment] table,
    and ``report-note`` when it has none; returns the rounds ([] and no change when every run finished)."""
    cfg_file = exp_dir / "experiment.toml"
    if not cfg_file.exists():
        raise SystemExit(f"{cfg_file} does not exist (experiments.run writes it)")
    rounds = stopping_rounds(load_runs(exp_dir, unfinished=True))
    if not rounds:
        return rounds
    text = cfg_file.read_text()
    meta = tomllib.loads(text).get("experiment", {})
    lines = [line for line in text.splitlines() if not line.startswith("report-rounds = ")]
    add = [f"report-rounds = {rounds}"] + ([f"report-note = {json.dumps(note)}"] if note and "report-note" not in meta
                                           else [])
    at = lines.index("[experiment]") + 1
    cfg_file.write_text("\n".join(lines[:at] + add + lines[at:]) + "\n")
    return rounds


def fixed_round_tables(runs: dict[str, list[dict[str, Any]]], order: list[str], paper: dict[str, Any],
                       rounds: list[int], note: str) -> list[str]:
    """An experiment stopped before its planned rounds (``report-rounds`` in its [experiment] table): a table
    per listed round over the runs that reached it, the others named with how far they got."""
    lines = [note.strip(), ""] if note else []
    for n in rounds:
        cut, short = at_round(runs, n)
        lines += [f"**Read at round {n}** (every run's first {n} rounds; "
                  + (f"stopped earlier, so not in this table: {'; '.join(short)}" if short else "every run reached it")
                  + ").", ""]
        if cut:
            lines += [table(cut, order), "", paper_table(cut, order, paper)]
    return lines


def table(runs: dict[str, list[dict[str, Any]]], order: list[str]) -> str:
    cols = [c for c in COLUMNS if any(d["final"].get(c[1]) is not None for ds in runs.values() for d in ds)]
    lines = ["| run | seeds | rounds | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for label in [lb for lb in order if lb in runs] + [lb for lb in runs if lb not in order]:
        docs = runs[label]
        rounds = sorted({len(d["rounds"]) for d in docs})
        cells = []
        for _header, key, scale, dec in cols:
            vals = [d["final"].get(key) for d in docs]
            if key == "rounds_to_target" and any(v is not None for v in vals):
                cells.append(mean_std([float(v) if v is not None else None for v in vals], 1, 1))
            else:
                cells.append(mean_std(vals, scale, dec))
        lines.append(f"| {label} | {len(docs)} | {'/'.join(map(str, rounds))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(name: str, runs: dict[str, list[dict[str, Any]]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, docs in runs.items():
        n = min(len(d["rounds"]) for d in docs)
        acc = np.array([[r["global_accuracy"] for r in d["rounds"][:n]] for d in docs], dtype=float)
        ax.plot(np.arange(1, n + 1), acc.mean(0), label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("G-FL accuracy (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(name)
    FIG_DIR.mkdir(parents=True, exist_ok=True)
    path = FIG_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def setting(doc: dict[str, Any]) -> str:
    rc = doc["run_config"]
    keys = ["dataset", "partition", "dirichlet-alpha", "model", "num-server-rounds", "local-epochs", "batch-size",
            "lr", "fraction-train"]
    return ", ".join(f"{k}={rc.get(k)}" for k in keys if k in rc)


PRESETS_INTRO = PROJECT_ROOT / "docs" / "templates" / "RESULTS_presets.md"
UNTUNED = PROJECT_ROOT / "docs" / "templates" / "RESULTS_untuned.md"  # note for experiments without tuning
# per experiment a note printed under its section's description (e.g. which method defaults its runs used)
MARKS = PROJECT_ROOT / "docs" / "templates" / "RESULTS_marks.toml"


def section_mark(name: str) -> list[str]:
    """The note docs/templates/RESULTS_marks.toml holds for experiment ``name`` (its [marks] table), as lines."""
    if not MARKS.exists():
        return []
    with MARKS.open("rb") as fh:
        note = tomllib.load(fh).get("marks", {}).get(name)
    return [f"**Note.** {note.strip()}", ""] if note else []


def _grid_line(doc: dict[str, Any]) -> str:
    """The lr grid as tuned: the final grid, and how it grew from the configured one (older tuning files
    predate the growth rule and say so). Runs tuned by separate ``--only`` invocations record their own grid
    (``runs.<label>.lr-grid``): one clause per distinct grid, naming its runs."""
    final, initial = doc.get("lr-grid"), doc.get("lr-grid-initial")
    if initial is None:
        return f"lr grid {final} (fixed: tuned before the edge-growth rule)"

    def how(grid: list[float], grown: dict[str, int]) -> str:
        return (f"grown from {initial} by {grown.get('low', 0)} value(s) below and {grown.get('high', 0)} above, at "
                f"most {doc.get('max-extend')} per side" if grid != initial else "as configured (no choice on an edge)")

    runs = doc.get("runs", {})
    if not any("lr-grid" in entry for entry in runs.values()):
        return f"final lr grid {final} ({how(final, doc.get('lr-grid-extended', {}))})"
    groups: dict[str, tuple[list[float], dict[str, int], list[str]]] = {}
    for label, entry in runs.items():
        grid, grown = entry.get("lr-grid", final), entry.get("lr-grid-extended", doc.get("lr-grid-extended", {}))
        groups.setdefault(json.dumps([grid, grown], sort_keys=True), (grid, grown, []))[2].append(label)
    return "; ".join(f"final lr grid {grid} for {', '.join(labels)} ({how(grid, grown)})"
                     for grid, grown, labels in groups.values())


def tuning_table(exp_dir: Path) -> str:
    """The tuning protocol's trials and choices (results/<name>/tuning.json), or '' without tuning."""
    f = exp_dir / "tuning.json"
    if not f.exists():
        return ""
    doc = json.loads(f.read_text())
    tol = doc.get("inert-tolerance")
    seeds = doc.get("seeds") or [doc.get("seed")]
    lines = [f"Tuning ({doc.get('metric')}, validation-fraction {doc.get('validation-fraction')}, tuning "
             + (f"seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}")
             + f", {_grid_line(doc)}; the test set is not evaluated during tuning; files: "
             f"`results/{exp_dir.name}/tuning.json`, `results/{exp_dir.name}/tuning/`)"
             + (f". Effective budget: distinct settings of the knobs that move some score by more than {tol} "
                f"(inert knobs do not count; a run short of the largest budget gets make-up lr values)"
                if tol is not None else "") + ":", "",
             "| run | trials | effective budget | inert knobs | chosen | validation acc of the choice | "
             "all trials (values: validation acc) |", "|---|---|---|---|---|---|---|"]
    for label, entry in doc.get("runs", {}).items():
        chosen = ", ".join(f"{k}={v}" for k, v in entry["chosen"].items())
        if entry.get("on-edge"):
            chosen += " (on the edge of the bounded grid)"
        for key, final in entry.get("knob-grids", {}).items():  # knob grids grown past an edge (tuning.py)
            if final != entry.get("knob-grids-initial", {}).get(key, final):
                chosen += f" ({key} grid grown to {final})"
        for key in entry.get("knob-on-edge", []):
            chosen += f" ({key} on the edge of its bounded grid)"
        trials = "; ".join(", ".join(f"{k}={v}" for k, v in t["values"].items()) + ": " +
                           (f"{100 * t['val_score']:.1f}" if t["val_score"] is not None else "diverged")
                           for t in entry["trials"])
        eff = entry.get("effective-budget", "–")
        inert = ", ".join(entry.get("inert-knobs", [])) or ("none" if "inert-knobs" in entry else "–")
        if entry.get("makeup-lr"):
            inert += f" (make-up lr {entry['makeup-lr']})"
        lines.append(f"| {label} | {entry['budget']} | {eff} | {inert} | {chosen} | {100 * entry['val_score']:.2f} | "
                     f"{trials} |")
    return "\n".join(lines) + "\n"


def split_note(exp_dir: Path) -> list[str]:
    """A warning for experiments recorded before the test split was fixed per dataset (no marker file)."""
    from experiments.run import SPLIT_MARKER

    if (exp_dir / SPLIT_MARKER).exists():
        return []
    return ["*Recorded with the earlier test split, drawn with each run's seed (before issue 31): one seed's test "
            "images are part of another seed's training pool, so its rows are not comparable with the fixed-split "
            "experiments.*", ""]


def provenance_note(exp_dir: Path) -> list[str]:
    """A note naming how many reported runs record neither their client split (client_split.json, written since
    issue 43) nor their code digest (``stack.code``); [] when every run records both."""
    files = sorted(exp_dir.glob("*/seed*/results.json"))
    no_split = sum(not (f.parent / "client_split.json").exists() for f in files)
    no_code = sum(not (json.loads(f.read_text()).get("stack") or {}).get("code") for f in files)
    if not (no_split or no_code):
        return []
    said = [f"{n} of {len(files)} runs record no {what}" for n, what in
            [(no_split, "client split (client_split.json)"), (no_code, "code digest")] if n]
    return [f"*Provenance: {'; '.join(said)}; they were recorded before those records existed: their federation "
            "and code can only be told from the commit that added their files (git log).*", ""]


def check_line(exp_dir: Path) -> list[str]:
    """What each re-run check found: of the reported runs (results/<exp>/near-ties/chosen_check*.json, written by
    ``python -m experiments.near_ties <config> --check-chosen [--check-file ...]``) and of tuning trials
    (results/<exp>/tuning/trial_check.json, ``python -m experiments.trial_check <config>``), per commit and machine
    it ran on: how many were identical, accuracy identical (losses in their last bits only) or differ, and by how
    much; one line per file, [] without a check."""
    lines = []
    files = [(p, "chosen run(s)", "--check-chosen", "near_ties", "runs")
             for p in sorted((exp_dir / "near-ties").glob("chosen_check*.json"))]
    trial_file = exp_dir / "tuning" / "trial_check.json"
    if trial_file.exists():
        files.append((trial_file, "tuning trial(s)", "", "trial_check", "trials"))
    for path, noun, flag, module, entries in files:
        check = json.loads(path.read_text())
        said = _check_summary(check, noun, entries)
        what = "the reported runs" if entries == "runs" else "tuning trials"
        seed = f", seed {check.get('seed')}" if "seed" in check else ""
        command = f"python -m experiments.{module} <config>" + (f" {flag}" if flag else "")
        if said:
            lines += [f"Re-run check of {what} (`results/{exp_dir.name}/{path.relative_to(exp_dir)}`{seed}, "
                      f"`{command}`): {said}.", ""]
    return lines


def _check_summary(check: dict[str, Any], noun: str = "chosen run(s)", entries: str = "runs") -> str:
    fallback = checked_on(check.get("stack") or {}, environ={})   # an entry of a file from before entries named it
    groups: dict[tuple, dict[str, list[str]]] = {}
    loss: dict[tuple, float] = {}
    accuracy: dict[tuple, float] = {}
    for label, run in sorted(check.get(entries, {}).items()):
        if run.get("status") not in ("identical", "accuracy identical", "differs"):
            continue
        on = run.get("checked_on") or fallback
        env = " ".join(f"{k}={v}" for k, v in sorted((on.get("kernel_env") or {}).items()))
        key = (str(on.get("commit") or "?")[:10], on.get("code") or "?", on.get("cpu_capability") or "?", env)
        groups.setdefault(key, {}).setdefault(run["status"], []).append(label)
        by_key = run.get("max_abs_difference_by_key") or {}
        if run["status"] == "accuracy identical":
            loss[key] = max([loss.get(key, 0.0), *(float(v) for k, v in by_key.items() if k.endswith("loss"))])
        moved = [float(v) for k, v in by_key.items() if k.endswith("accuracy")]
        if run["status"] == "differs" and moved:
            accuracy[key] = max(accuracy.get(key, 0.0), *moved)
    parts = []
    for key, by_status in groups.items():
        n = sum(len(v) for v in by_status.values())
        said = [f"{len(by_status['identical'])} identical"] if "identical" in by_status else []
        if "accuracy identical" in by_status:
            said.append(f"{len(by_status['accuracy identical'])} accuracy identical (every accuracy of every round "
                        f"equal, the losses within {loss[key]:.1e})")
        if "differs" in by_status:
            how = (f"; largest per-round accuracy difference {100 * accuracy[key]:.2f} points"
                   if key in accuracy else "")
            said.append(f"{len(by_status['differs'])} differ ({', '.join(by_status['differs'])}{how})")
        kernels = f"{key[2]} CPU kernels" + (f" via {key[3]}" if key[3] else "")
        parts.append(f"at commit {key[0]} (code {key[1]}, {kernels}), {n} {noun} re-run: "
                     + ", ".join(said))
    return "; ".join(parts)


def presets_status(results_root: Path) -> str:
    """Each paper preset, with the reported runs in its setting (experiments/preset_runs.py) and, below the table,
    how those runs depart from the preset's values."""
    from experiments.preset_runs import departures_lines, preset_runs, status
    from flcore.presets import presets

    found = preset_runs(results_root)
    lines = [PRESETS_INTRO.read_text().rstrip("\n"), "", "| preset | paper | setting | clients | status |",
             "|---|---|---|---|---|"]
    details: list[str] = []
    for p in presets().values():
        runs = found.get(p.name, [])
        lines.append(f"| `{p.name}` | {p.paper} | {p.setting} | {p.num_supernodes} | {status(runs)} |")
        details += departures_lines(p.name, runs)
    if details:
        lines += ["", "How the runs in a preset's setting depart from its values (run value, then the preset's; "
                      "a value that differs between seeds is listed per seed, joined by /):", "", *details]
    return "\n".join(lines) + "\n"


def paper_table(runs: dict[str, list[dict[str, Any]]], order: list[str], paper: dict[str, Any]) -> str:
    """Ours beside the paper's values (an experiment config's [paper] table: g-fl / p-fl per run label, and the
    paper's standard deviations as g-fl-std / p-fl-std where it prints them), in %: final G-FL and P-FL, mean ± std
    over seeds; '-' where the paper's table has no row."""
    if not paper:
        return ""
    lines = [f"Beside the paper ({paper.get('source', 'the paper')}):", "",
             "| run | seeds | G-FL (ours) | G-FL (paper) | P-FL (ours) | P-FL (paper) |", "|---|---|---|---|---|---|"]
    for label in [lb for lb in order if lb in runs] + [lb for lb in runs if lb not in order]:
        docs = runs[label]

        def theirs(kind: str, label: str = label) -> str:
            value, std = (paper.get(kind) or {}).get(label), (paper.get(f"{kind}-std") or {}).get(label)
            if value is None:
                return "-"
            return f"{100 * value:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")

        lines.append(f"| {label} | {len(docs)} | {mean_std([d['final'].get('global_accuracy') for d in docs], 100, 2)}"
                     f" | {theirs('g-fl')} | {mean_std([d['final'].get('local_accuracy') for d in docs], 100, 2)}"
                     f" | {theirs('p-fl')} |")
    return "\n".join(lines) + "\n"


def stacks_line(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The stacks the runs of a table came from (issue 30), each with its number of runs."""
    counts: dict[str, int] = {}
    for docs in runs.values():
        for doc in docs:
            key = describe(doc.get("stack"))
            counts[key] = counts.get(key, 0) + 1
    return "Stack: " + "; ".join(f"{k} ({n} run{'s' if n > 1 else ''})" for k, n in sorted(counts.items())) + "."


def experiment_section(exp_dir: Path) -> list[str]:
    """The lines of one experiment's section (heading first; [] when it has no finished run); draws its figure."""
    meta: dict[str, Any] = {}
    paper: dict[str, Any] = {}
    order: list[str] = []
    cfg_file = exp_dir / "experiment.toml"
    if cfg_file.exists():
        with cfg_file.open("rb") as fh:
            conf = tomllib.load(fh)
        meta = conf.get("experiment", {})
        paper = conf.get("paper", {})
        order = list(conf.get("runs", {}))
    report_rounds = [int(n) for n in meta.get("report-rounds", [])]
    runs = load_runs(exp_dir, unfinished=bool(report_rounds))
    if not runs:
        return []
    first = next(iter(runs.values()))[0]
    fig = plot(exp_dir.name, runs)
    target = first["final"].get("target_accuracy")
    return [f"## {meta.get('title', exp_dir.name)}", "",
            meta.get("description", "").strip(), "", *section_mark(exp_dir.name),
            f"Experiment `{exp_dir.name}` (config `experiments/configs/` → copy in `results/{exp_dir.name}/experiment.toml`); "
            f"{meta.get('num-supernodes', first['final'].get('num_clients'))} clients; target accuracy {target}. "
            f"Common setting: {setting(first)}.", "", stacks_line(runs), "", *check_line(exp_dir), *split_note(exp_dir),
            *provenance_note(exp_dir),
            *(fixed_round_tables(runs, order, paper, report_rounds, meta.get("report-note", "")) if report_rounds
              else [table(runs, order), "", paper_table(runs, order, paper)]),
            *paired_table(runs, meta.get("paired", []), float(meta.get("paired-margin", 1.0))),
            *versus_best_table(exp_dir.parent, exp_dir.name, meta.get("versus-best", []), paper), tuning_table(exp_dir) or meta.get("untuned-note") or UNTUNED.read_text(),
            f"![{exp_dir.name}](figures/{fig.name})", ""]


def build() -> str:
    parts = [HEADER.read_text().rstrip("\n"), ""]
    if CLAIMS.exists():
        parts += [ledger_for(RESULTS_ROOT, CLAIMS), ""]
    parts += [presets_status(RESULTS_ROOT), ""]
    for exp_dir in sorted(p for p in RESULTS_ROOT.iterdir() if p.is_dir()) if RESULTS_ROOT.exists() else []:
        parts += experiment_section(exp_dir)
    return "\n".join(parts) + "\n"


def replace_section(doc: str, lines: list[str]) -> str:
    """``doc`` with the section whose heading is ``lines[0]`` (up to the next '## ' heading) replaced by
    ``lines``; a clear error when the doc has no such section (then regenerate the whole doc)."""
    heading = lines[0]
    start = doc.find("\n" + heading + "\n")
    if start < 0:
        raise ValueError(f"{DOC} has no section '{heading}': run `python -m experiments.report` without options")
    end = doc.find("\n## ", start + len(heading) + 2)
    return doc[:start + 1] + "\n".join(lines) + ("\n" + doc[end + 1:] if end >= 0 else "\n")


def replace_ledger(doc: str, ledger: str) -> str:
    """``doc`` (a RESULTS.md) with its claims ledger section replaced by ``ledger``: what `--ledger-only` writes
    when other sections' result files are someone else's work in progress (a shared working tree)."""
    start_line = _ledger_heading()
    end_line = PRESETS_INTRO.read_text().splitlines()[0]
    if start_line not in doc or end_line not in doc:
        raise ValueError(f"{DOC} has no ledger section ('{start_line}' ... '{end_line}'): run without --ledger-only")
    start, end = doc.index(start_line), doc.index(end_line)
    return doc[:start] + ledger + "\n\n" + doc[end:]


def _ledger_heading() -> str:
    """The ledger template's first line (its heading)."""
    from experiments.claims import INTRO

    return INTRO.read_text().splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger-only", action="store_true",
                    help="regenerate only the claims ledger section of the existing docs/RESULTS.md")
    ap.add_argument("--experiments", nargs="+", metavar="NAME",
                    help="with --ledger-only: also regenerate these experiments' sections (results/NAME) in place")
    ap.add_argument("--mark-stopped", nargs="+", metavar="NAME", help="results/NAME stopped before its planned "
                    "rounds (a deadline): set its report-rounds to where its runs stopped, then regenerate the doc")
    ap.add_argument("--note", default="", help="with --mark-stopped: the report-note, if it has none")
    args = ap.parse_args(argv)
    for name in args.mark_stopped or []:
        rounds = mark_stopped(RESULTS_ROOT / name, args.note)
        print(f"results/{name}: " + (f"report-rounds = {rounds}" if rounds else "every run finished"))
    if args.experiments and not args.ledger_only:
        ap.error("--experiments goes with --ledger-only (without it the whole doc is regenerated)")
    DOC.parent.mkdir(parents=True, exist_ok=True)
    if args.ledger_only:
        doc = replace_ledger(DOC.read_text(), ledger_for(RESULTS_ROOT, CLAIMS))
        for name in args.experiments or []:
            lines = experiment_section(RESULTS_ROOT / name)
            if not lines:
                raise SystemExit(f"results/{name} has no finished run")
            doc = replace_section(doc, lines)
        DOC.write_text(doc)
    else:
        DOC.write_text(build())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
