"""Credit heatmaps, the colours: one symmetric diverging scale per page, shared by the HTML page
and the PNG figure.

- ``diverging_color(value, vmax)``: the hex colour of a value (white at 0, red below, blue above);
- ``colormap()``: the same scale as a matplotlib colormap (matplotlib imported inside it only);
- ``page_scale(cards, color_by)``: the largest |value| coloured on a page; ``COLOR_BY``: what a
  token can be coloured by (its advantage, or its segment's credit).
"""

from __future__ import annotations

import math
from typing import Sequence

from rredcot_cli.report.heatmap_cards import Card, Token

COLOR_BY = ("advantage", "credit")

# Diverging scale (ColorBrewer RdBu, white centre): index 0 is 0, the last entry is |v| = vmax.
_NEG = ["#ffffff", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"]
_POS = ["#ffffff", "#d1e5f0", "#92c5de", "#4393c3", "#2166ac"]
FIRST_WRONG = "#111111"


def _hex(rgb: Sequence[float]) -> str:
    return "#" + "".join(f"{int(round(max(0.0, min(255.0, c)))):02x}" for c in rgb)


def _rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def diverging_color(value: float, vmax: float) -> str:
    """Hex colour of ``value`` on the page's scale: white at 0, red below, blue above, |v|>=vmax darkest."""
    if not math.isfinite(value) or vmax <= 0:
        return "#ffffff"
    t = min(1.0, abs(value) / vmax)
    stops = _NEG if value < 0 else _POS
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = _rgb(stops[i]), _rgb(stops[i + 1])
    return _hex([a[j] + (b[j] - a[j]) * f for j in range(3)])


def text_color(value: float, vmax: float) -> str:
    return "#ffffff" if vmax > 0 and math.isfinite(value) and abs(value) / vmax > 0.72 else "#111111"


def colormap():
    """The same diverging scale as a matplotlib colormap (from -vmax to +vmax)."""
    # deferred: matplotlib (~3 s to import) loads only when a figure is drawn
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("rredcot_diverging", list(reversed(_NEG)) + _POS[1:])


def token_value(card: Card, token: Token, color_by: str) -> float:
    if color_by == "credit":
        return card.segments[token.segment_idx].credit if token.segment_idx < len(card.segments) else 0.0
    return token.advantage


def page_scale(cards: Sequence[Card], color_by: str = "advantage") -> float:
    """Symmetric scale of a page: the largest |value| coloured on it (1.0 when all are 0)."""
    values = [abs(token_value(c, t, color_by)) for c in cards for t in c.tokens]
    values += [abs(s.credit) for c in cards for s in c.segments]
    vmax = max((v for v in values if math.isfinite(v)), default=0.0)
    return vmax if vmax > 0 else 1.0
