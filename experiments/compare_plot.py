"""The figure of ``noniid-fl compare``: one panel per metric present in the runs, a line per group (the mean
over its seeds) with a shaded band (min–max over seeds, or ± std), the same colour for a group in every panel.

Panels: G-FL accuracy (always), G-FL loss, P-FL accuracy (local models on local test splits) and fairness (the
global model's accuracy on its worst client) where some run has them.
"""

from __future__ import annotations

from pathlib import Path

from experiments.compare import BANDS, CompareError, Group, column_values, series

# (column of a results.json round, panel title, y label)
PANELS = (("global_accuracy", "G-FL accuracy (global model, global test set)", "accuracy"),
          ("global_loss", "G-FL loss (global model, global test set)", "loss"),
          ("local_accuracy", "P-FL accuracy (local models, local test splits)", "accuracy"),
          ("client_accuracy_worst", "fairness: global model on its worst client", "accuracy"))
BAND_TEXT = {"minmax": "band: min–max over seeds", "std": "band: mean ± std over seeds"}


def present_panels(groups: list[Group]) -> list[tuple[str, str, str]]:
    """The PANELS some run has a value for (G-FL accuracy always first)."""
    def has(column: str) -> bool:
        return any(column_values(r, column) for g in groups for r in g.runs)

    return [p for p in PANELS if p[0] == "global_accuracy" or has(p[0])]


def figure(groups: list[Group], band: str = "minmax", title: str = ""):
    """The comparison as a matplotlib Figure (not saved; see :func:`save`): one legend below the panels (a
    group's label and its number of seeds), the band named in the title (``title``: default the dataset)."""
    if band not in BANDS:
        raise CompareError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = present_panels(groups)
    title = title or str(groups[0].runs[0].run_config["dataset"])
    cols = 1 if len(panels) == 1 else 2
    nrows = (len(panels) + cols - 1) // cols
    ncol = 1 if len(groups) <= 4 else 2 if len(groups) <= 12 else 3
    legend_rows = -(-len(groups) // ncol)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 3.8 * nrows + 0.22 * legend_rows + 0.4),
                             squeeze=False, layout="constrained")
    colors = [plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")(i) for i in range(20)]
    for ax, (column, head, ylabel) in zip(axes.flat, panels):
        for i, g in enumerate(groups):
            rounds, mean, low, high = series(g, column, band)
            if not len(rounds):
                continue
            color = colors[i % len(colors)]
            n = len(g.runs)
            ax.plot(rounds, mean, marker="o", ms=3, color=color, label=f"{g.label} ({n} seed{'s' if n > 1 else ''})")
            if n > 1:
                ax.fill_between(rounds, low, high, color=color, alpha=0.2, linewidth=0)
        ax.set_title(head, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=ncol, fontsize=8, frameon=False)
    fig.suptitle((title + "; " if title else "") + BAND_TEXT[band], fontsize=10)
    return fig


def save(fig, path: Path, svg: bool = False) -> list[Path]:
    """Write ``fig`` as PNG at ``path`` (and an SVG beside it when ``svg``); return the files written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    out = [path]
    if svg:
        out.append(path.with_suffix(".svg"))
        fig.savefig(out[-1])
    return out
