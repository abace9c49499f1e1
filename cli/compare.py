"""``noniid-fl compare RUN_OR_DIR ...``: the runs side by side, as a figure and a table (experiments/compare.py).

Exit codes: 0 written; 2 a path without runs, or runs measured on different test sets (the reason names the
runs and the key).
"""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """A run folder holds results.json (runs/<name>/); an experiment folder (results/<experiment>/, or one of
its labels) holds them below (tuning trials only when named). Runs whose run config is equal but for the seed
(and keys that do not change the numbers: out-dir, data-root, device, engine, ...) are one group: its mean per
round with a band over its seeds. Runs of different datasets or test splits are refused.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser("compare", help="compare runs: figure and table", epilog=EPILOG,
                         description="Compare runs: G-FL accuracy (and loss, P-FL, fairness where present) per "
                                     "round in one figure, and a table of final and best accuracy, rounds to "
                                     "target, time per round and stack.",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("paths", nargs="+", metavar="RUN_OR_DIR", type=Path, help="run or experiment result folders")
    cmp.add_argument("-o", "--output", type=Path, default=Path("compare.png"), metavar="PNG",
                     help="the figure's file (default: compare.png here)")
    cmp.add_argument("--svg", action="store_true", help="also write the figure as SVG beside the PNG")
    cmp.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    cmp.add_argument("--band", choices=("minmax", "std"), default="minmax",
                     help="band over seeds: min-max (default) or mean +- std")
    cmp.add_argument("--target", type=float, default=None, metavar="ACC",
                     help="accuracy for rounds-to-target, in [0, 1] (default: each run's target-accuracy)")


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the table, write the figure; a refusal is one line on stderr and exit code 2."""
    import sys

    from experiments.compare import CompareError, compare, table_text
    from experiments.compare_plot import figure, save

    try:
        if args.target is not None and not 0 <= args.target <= 1:
            raise CompareError(f"--target must be an accuracy in [0, 1], got {args.target}")
        groups = compare(args.paths)
        text = table_text(groups, markdown=args.markdown, target=args.target)
        fig = figure(groups, band=args.band)
        written = save(fig, args.output, svg=args.svg)
    except CompareError as exc:
        print(f"noniid-fl compare: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    print("figure: " + ", ".join(map(str, written)))
    return 0
