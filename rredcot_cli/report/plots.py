"""The report's figures (``final_accuracy.png``, ``accuracy_vs_step.png``,
``accuracy_by_length.png``), each drawn on matplotlib's Agg canvas (no pyplot state) and saved
atomically. matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from rredcot_cli.store import runs as run_files
from rredcot_cli.report.compare import CONFIDENCE, GroupSummary


# Past this many groups the legend moves outside the axes and the confidence bands fade, so the
# lines stay readable.
CROWDED = 5


def _figure(title: str, groups: int = 1, integer_x: bool = True):
    # deferred: matplotlib (~3 s to import) loads only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10.5 if groups > CROWDED else 7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and chain lengths are whole numbers
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _legend(ax, groups: int) -> None:  # noqa: ANN001 - a matplotlib Axes
    if groups > CROWDED:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    else:
        ax.legend(fontsize=8, loc="best")


def _styles(n: int) -> list[tuple[Any, str]]:
    """(colour, line style) per group: tab10 up to 10 groups, tab20 beyond, then dashed repeats."""
    from matplotlib import colormaps  # deferred: matplotlib (~3 s to import) loads only when a figure is drawn

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    size = 10 if n <= 10 else 20
    return [(cmap(i % size), ("-", "--", ":")[(i // size) % 3]) for i in range(n)]


def _colors(n: int) -> list:
    return [color for color, _ in _styles(n)]


def plot_accuracy_vs_step(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Mean held-out pass@1 per step, one line per group, a shaded 95% band where there is one."""
    fig, ax = _figure(f"held-out pass@1 vs training step (mean, {CONFIDENCE:.0%} CI over seeds)", len(groups))
    band_alpha = 0.2 if len(groups) <= CROWDED else 0.06
    for group, (color, style) in zip(groups, _styles(len(groups))):
        steps = sorted(group.curve)
        means = [group.curve[s].mean for s in steps]
        ax.plot(steps, means, marker="o", markersize=3, color=color, linestyle=style,
                label=f"{group.label} (n={len(group.runs)})")
        lows, highs = [group.curve[s].low for s in steps], [group.curve[s].high for s in steps]
        if not any(math.isnan(x) for x in lows):
            ax.fill_between(steps, lows, highs, color=color, alpha=band_alpha, linewidth=0)
    ax.set_xlabel("training step (one batch of rollouts and its policy updates)")
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(-0.02, 1.02)
    _legend(ax, len(groups))
    return _save(fig, path)


def plot_final_accuracy(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Final held-out pass@1 per group, best first, with its 95% interval over seeds; a dashed line
    marks GRPO's mean when a plain ``grpo`` group is there, the baseline everything is read against."""
    fig, ax = _figure(f"final held-out pass@1 (mean, {CONFIDENCE:.0%} CI over seeds)", integer_x=False)
    fig.set_size_inches(7.5, 1.2 + 0.32 * max(1, len(groups)))
    ordered = sorted(groups, key=lambda g: g.pass1.mean)
    colors = dict(zip([g.label for g in groups], _colors(len(groups))))
    for y, group in enumerate(ordered):
        stat = group.pass1
        if math.isnan(stat.low):
            ax.plot([stat.mean], [y], "o", color=colors[group.label])
        else:
            ax.errorbar([stat.mean], [y], xerr=[[stat.mean - stat.low], [stat.high - stat.mean]], fmt="o",
                        capsize=3, color=colors[group.label])
    baseline = next((g for g in groups if g.label == "grpo"), None)
    if baseline is not None:
        ax.axvline(baseline.pass1.mean, color="grey", linestyle="--", linewidth=1, label="grpo mean")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(ordered)), [f"{g.label} (n={len(g.runs)})" for g in ordered], fontsize=8)
    ax.set_xlabel("held-out pass@1 after training")
    return _save(fig, path)


def plot_accuracy_by_length(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Final held-out accuracy per chain length, one line per group with 95% error bars."""
    fig, ax = _figure(f"final held-out accuracy by chain length (mean, {CONFIDENCE:.0%} CI over seeds)", len(groups))
    if not any(g.by_length for g in groups):
        ax.text(0.5, 0.5, "no chain lengths in the eval rows", ha="center", va="center", transform=ax.transAxes)
    width = 0.25 / max(1, len(groups))
    for i, (group, (color, style)) in enumerate(zip(groups, _styles(len(groups)))):
        if not group.by_length:
            continue
        lengths = sorted(group.by_length)
        xs = [n + (i - (len(groups) - 1) / 2) * width for n in lengths]  # side by side, not on top
        means = [group.by_length[n].mean for n in lengths]
        errors = [[0.0 if math.isnan(group.by_length[n].low) else group.by_length[n].mean - group.by_length[n].low
                   for n in lengths],
                  [0.0 if math.isnan(group.by_length[n].high) else group.by_length[n].high - group.by_length[n].mean
                   for n in lengths]]
        ax.errorbar(xs, means, yerr=errors, marker="o", markersize=4, capsize=3, color=color, linestyle=style,
                    label=f"{group.label} (n={len(group.runs)})")
    ax.set_xlabel("chain length (computed steps)")
    ax.set_ylabel("held-out accuracy (fraction of samples correct)")
    ax.set_ylim(-0.02, 1.02)
    if any(g.by_length for g in groups):
        _legend(ax, len(groups))
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:  # noqa: ANN001 - a matplotlib Figure
    path = Path(path)
    with run_files.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path
