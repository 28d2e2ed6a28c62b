"""Credit heatmaps as a figure: ``render_png(cards, path)`` draws the cards with matplotlib (Agg
canvas, no pyplot state), one row per completion, on the page's diverging scale
(``rredcot_cli.report.heatmap_colors``). matplotlib is imported inside ``render_png`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rredcot_cli.report.heatmap_cards import Card
from rredcot_cli.report.heatmap_colors import FIRST_WRONG, colormap, page_scale, text_color


def render_png(cards: Sequence[Card], path: str | Path, title: str | None = None, dpi: int = 110) -> Path:
    """Write a PNG: one row per card, segments as blocks coloured by credit along token position
    (a thin strip below shows token advantages), V(S_k) overlaid where the method has values,
    the first wrong step framed, and a colorbar. Uses matplotlib's Agg canvas (no pyplot state)."""
    # deferred: matplotlib (~3 s to import) loads only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    path = Path(path)
    cmap = colormap()
    vmax = page_scale(cards, "credit")
    vmax = max(vmax, max((abs(a) for c in cards for a in c.token_advantages), default=0.0))
    norm = Normalize(vmin=-vmax, vmax=vmax)
    n = max(1, len(cards))
    width = 13.0
    fig = Figure(figsize=(width, 1.25 + 1.05 * n), layout="constrained")
    FigureCanvasAgg(fig)
    method = next((c.method for c in cards if c.method), "")
    fig.suptitle(title or f"rredcot heatmap{' · ' + method if method else ''}", fontsize=12, x=0.01, ha="left")
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    xmax = max([c.num_tokens for c in cards] + [1])
    any_values = any(c.has_values for c in cards)
    pts_per_token = (width * 0.8 * 72) / xmax

    if not cards:
        axes[0].axis("off")
        axes[0].text(0.5, 0.5, "no completions selected", ha="center", va="center", transform=axes[0].transAxes)
    for ax, card in zip(axes, cards):
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        outcome = "correct" if card.correct else ("unscorable" if not card.scorable else "incorrect")
        pred = "none" if card.pred_answer is None else card.pred_answer
        label = f"{card.prompt_id} #{card.sample_idx} · {outcome} · pred {pred} · gold {card.gold_answer}"
        if card.first_wrong_step is not None:
            label += f" · first wrong step {card.first_wrong_step + 1}"
        ax.set_title(label, loc="left", fontsize=8.5,
                     color="#2166ac" if card.correct else "#b2182b", pad=3)
        if card.num_tokens == 0:
            ax.text(0.01, 0.5, "(empty completion)", transform=ax.transAxes, va="center", fontsize=8, color="#777")
            continue
        for seg in card.segments:
            w = seg.token_end - seg.token_start
            ax.add_patch(Rectangle((seg.token_start, 0.28), w, 0.72, facecolor=cmap(norm(seg.credit)),
                                   edgecolor="#c8c8c8", linewidth=0.6))
            label_text = seg.text.replace("\n", " ").strip()
            if label_text and len(label_text) * 7 * 0.62 < w * pts_per_token - 2:
                ax.text(seg.token_start + w / 2, 0.64, label_text, ha="center", va="center", fontsize=7,
                        family="monospace", color=text_color(seg.credit, vmax), clip_on=True)
        ax.imshow([card.token_advantages], extent=(0, card.num_tokens, 0.0, 0.2), aspect="auto",
                  cmap=cmap, norm=norm, interpolation="nearest")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, 1)
        if card.first_wrong_token_range is not None:
            a, b = card.first_wrong_token_range
            ax.add_patch(Rectangle((a, 0.0), max(b - a, 0.5), 1.0, fill=False, edgecolor=FIRST_WRONG,
                                   linewidth=2.0, zorder=5))
            ax.plot([a], [1.0], marker="v", color=FIRST_WRONG, markersize=6, clip_on=False, zorder=6)
        if card.has_values:
            twin = ax.twinx()
            xs = [(s.token_start + s.token_end) / 2 for s in card.segments if s.value is not None]
            ys = [s.value for s in card.segments if s.value is not None]
            twin.plot(xs, ys, color="#1b7837", marker="o", markersize=3, linewidth=1.5)
            lo, hi = min(0.0, min(ys)), max(1.0, max(ys))
            span = (hi - lo) / 0.67  # [lo, hi] drawn over the blocks (0.30 to 0.97 of the row height)
            twin.set_ylim(lo - 0.30 * span, lo - 0.30 * span + span)
            twin.set_yticks([lo, hi])
            twin.tick_params(labelsize=7, colors="#1b7837")
            twin.set_ylabel("V(S_k)", fontsize=7, color="#1b7837")
            twin.spines["top"].set_visible(False)
    axes[-1].set_xlabel("token position", fontsize=9)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
    sm = ScalarMappable(norm=norm, cmap=cmap)
    bar = fig.colorbar(sm, ax=list(axes), location="right", shrink=min(1.0, 3.0 / n + 0.2), pad=0.01, aspect=25)
    bar.set_label("segment credit (blocks) · token advantage (strip)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    note = "black frame: first wrong step"
    if any_values:
        note += " · green line: value V(S_k)"
    fig.text(0.99, 0.995, note, ha="right", va="top", fontsize=8, color="#333")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path
