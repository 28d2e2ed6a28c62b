"""Credit heatmaps as a page: ``render_html(cards)`` gives one self-contained HTML page (inline
CSS and SVG; no scripts, fonts or links), tokens coloured on the page's diverging scale
(``rredcot_cli.report.heatmap_colors``), segment boundaries, the value curve V(S_k) as inline SVG
and the first wrong step framed.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any, Sequence

from rredcot_cli.report.heatmap_cards import Card, Token
from rredcot_cli.report.heatmap_colors import (COLOR_BY, FIRST_WRONG, diverging_color, page_scale, text_color,
                                                token_value)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:+.3f}"


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;padding:20px 28px;background:#f4f4f2;color:#111}
h1{font-size:20px;margin:0 0 4px}
.sub{color:#555;margin:0 0 12px}
.legend{display:flex;flex-wrap:wrap;align-items:center;gap:10px 18px;background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin-bottom:16px;position:sticky;top:0;z-index:2}
.legend .scale{display:flex;align-items:center;gap:6px}
.legend .bar{display:inline-block;width:220px;height:14px;border:1px solid #999;border-radius:2px}
.legend .demo{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;padding:0 3px}
.card{background:#fff;border:1px solid #ddd;border-left:6px solid #999;border-radius:6px;padding:12px 16px;margin:0 0 16px}
.card.correct{border-left-color:#2166ac}
.card.incorrect{border-left-color:#b2182b}
.head{display:flex;flex-wrap:wrap;gap:4px 16px;align-items:baseline;margin-bottom:8px}
.pid{font-weight:600;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.badge{border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600;color:#fff}
.badge.ok{background:#2166ac}.badge.bad{background:#b2182b}.badge.na{background:#777}
.kv{color:#444}.kv code{background:#f0f0f0;padding:0 4px;border-radius:3px}
details{margin:6px 0}
summary{cursor:pointer;color:#555}
pre.prompt{white-space:pre-wrap;background:#fafafa;border:1px solid #eee;padding:6px 8px;margin:4px 0;font-size:13px}
.completion{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:14px;line-height:2.0;white-space:pre-wrap;word-break:break-word;background:#fff;padding:4px 2px}
.seg{border-left:2px solid #666;padding-bottom:1px}
.seg.s0{border-bottom:2px solid #c8c8c8}
.seg.s1{border-bottom:2px solid #7a7a7a}
.seg:first-child{border-left-color:transparent}
.t{padding:1px 0}
.t.special{opacity:.6;font-style:italic}
.nl::before{content:"\\21b5";color:#999;font-size:11px}
.fw{box-shadow:inset 0 2px 0 #111,inset 0 -2px 0 #111}
.fw.fws{box-shadow:inset 2px 0 0 #111,inset 0 2px 0 #111,inset 0 -2px 0 #111}
.fw.fwe{box-shadow:inset -2px 0 0 #111,inset 0 2px 0 #111,inset 0 -2px 0 #111}
.fw.fws.fwe{box-shadow:inset 0 0 0 2px #111}
.fwnote{font-size:12px;color:#111;font-weight:600}
svg.vc{display:block;margin:8px 0 2px;background:#fcfcfc;border:1px solid #eee;border-radius:4px}
svg.vc text{font:10px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;fill:#444}
table.segs{border-collapse:collapse;font-size:12px;margin-top:4px}
table.segs td,table.segs th{border:1px solid #e4e4e4;padding:2px 6px;text-align:right;vertical-align:top}
table.segs td.txt{text-align:left;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap}
table.segs tr.fwrow td{outline:2px solid #111;outline-offset:-2px}
.empty{color:#777;font-style:italic}
"""


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _token_html(text: str) -> str:
    """Escaped token text; each newline is preceded by a CSS-drawn return glyph (not copied text)."""
    parts = text.split("\n")
    return '<span class="nl"></span>\n'.join(_esc(p) for p in parts)


def _legend(vmax: float, color_by: str) -> str:
    stops = ", ".join(
        f"{diverging_color(v, vmax)} {100 * (v + vmax) / (2 * vmax):.1f}%"
        for v in [vmax * x / 8 for x in range(-8, 9)]
    )
    what = "token advantage" if color_by == "advantage" else "segment credit"
    return (
        '<div class="legend">'
        f'<span class="scale"><b>{_esc(what)}</b> <span>{_fmt(-vmax)}</span>'
        f'<span class="bar" style="background:linear-gradient(to right, {stops})"></span>'
        f'<span>{_fmt(vmax)}</span></span>'
        "<span>red: pushed down (hurt) · white: 0 · blue: pushed up (helped); one symmetric scale for the page</span>"
        '<span><span class="demo seg s1">segment</span><span class="demo seg s0">boundary</span></span>'
        '<span><span class="demo t fw fws fwe">first wrong step</span></span>'
        "<span>hover a token for its segment, value V(S<sub>k</sub>) and credit</span>"
        "</div>"
    )


def _value_svg(card: Card, width: int = 640, height: int = 130) -> str:
    """Inline SVG line chart of V(S_k) over the card's segments (gaps where a value is missing)."""
    points = [(s.idx, s.value) for s in card.segments]
    vals = [v for _, v in points if v is not None]
    lo, hi = min(0.0, min(vals)), max(1.0, max(vals))
    if hi - lo < 1e-9:
        hi = lo + 1.0
    left, right, top, bottom = 46, 12, 12, 24
    k = max(1, len(points) - 1)

    def x(i: int) -> float:
        return left + (width - left - right) * (i / k if len(points) > 1 else 0.5)

    def y(v: float) -> float:
        return top + (height - top - bottom) * (hi - v) / (hi - lo)

    out = [f'<svg class="vc" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="value curve V(S_k)">']
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>')
    out.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>')
    for v in sorted({lo, hi, 0.0} if lo < 0 < hi else {lo, hi}):
        out.append(f'<text x="{left - 4}" y="{y(v) + 3:.1f}" text-anchor="end">{v:g}</text>')
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{width - right}" y2="{y(v):.1f}" stroke="#eee"/>')
    out.append(f'<text x="4" y="{top + 8}">V(S_k)</text>')
    step = max(1, math.ceil(len(points) / 20))
    for i, _ in points[::step]:
        out.append(f'<text x="{x(i):.1f}" y="{height - bottom + 13}" text-anchor="middle">{i}</text>')
    fw = card.first_wrong_segment
    if fw is not None:
        out.append(f'<line x1="{x(fw):.1f}" y1="{top}" x2="{x(fw):.1f}" y2="{height - bottom}" '
                   f'stroke="{FIRST_WRONG}" stroke-width="1.5" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x(fw) + 4:.1f}" y="{top + 8}">first wrong</text>')
    run: list[str] = []
    runs = []
    for i, v in points:
        if v is None:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(f"{x(i):.1f},{y(v):.1f}")
    if run:
        runs.append(run)
    for r in runs:
        out.append(f'<polyline fill="none" stroke="#1b7837" stroke-width="2" points="{" ".join(r)}"/>')
    for seg in card.segments:
        if seg.value is None:
            continue
        out.append(f'<circle cx="{x(seg.idx):.1f}" cy="{y(seg.value):.1f}" r="3" fill="#1b7837">'
                   f'<title>segment {seg.idx}: V(S_k) {_fmt(seg.value)}, credit {_fmt(seg.credit)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def _card_html(card: Card, vmax: float, color_by: str) -> str:
    if not card.scorable:
        badge = '<span class="badge na">unscorable</span>'
    elif card.correct:
        badge = f'<span class="badge ok">correct · reward {card.reward:g}</span>'
    else:
        badge = f'<span class="badge bad">incorrect · reward {card.reward:g}</span>'
    pred = "<i>none</i>" if card.pred_answer is None else f"<code>{_esc(card.pred_answer)}</code>"
    fw = ""
    if card.first_wrong_step is not None:
        fw = f'<span class="fwnote">first wrong step: {card.first_wrong_step + 1}</span>'
    head = (
        f'<div class="head"><span class="pid">{_esc(card.prompt_id)} #{card.sample_idx}</span>{badge}'
        f'<span class="kv">gold <code>{_esc(card.gold_answer)}</code></span>'
        f'<span class="kv">predicted {pred}</span>'
        f'<span class="kv">{card.num_tokens} tokens · {len(card.segments)} segments'
        f'{" · " + _esc(card.finish_reason) if card.finish_reason else ""}</span>{fw}</div>'
    )
    prompt = f'<details><summary>prompt</summary><pre class="prompt">{_esc(card.prompt)}</pre></details>'

    by_seg: dict[int, list[Token]] = defaultdict(list)
    for t in card.tokens:
        by_seg[t.segment_idx].append(t)
    flagged = [i for i, t in enumerate(card.tokens) if t.first_wrong]
    first_fw, last_fw = (flagged[0], flagged[-1]) if flagged else (-1, -1)
    index_of = {id(t): i for i, t in enumerate(card.tokens)}
    body = []
    for seg in card.segments:
        seg_title = (f"segment {seg.idx} · tokens {seg.token_start}–{seg.token_end} · "
                     f"V(S_k) {_fmt(seg.value)} · credit {_fmt(seg.credit)}")
        pieces = []
        for t in by_seg.get(seg.idx, []):
            v = token_value(card, t, color_by)
            classes = ["t"]
            if t.special:
                classes.append("special")
            if t.first_wrong:
                classes.append("fw")
                i = index_of[id(t)]
                if i == first_fw:
                    classes.append("fws")
                if i == last_fw:
                    classes.append("fwe")
            what = f"token {t.position}" if card.token_level else f"tokens {seg.token_start}–{seg.token_end}"
            title = (f"{what} · advantage {_fmt(t.advantage)} · segment {seg.idx} · "
                     f"V(S_k) {_fmt(seg.value)} · credit {_fmt(seg.credit)}")
            if t.first_wrong:
                title += " · first wrong step"
            style = f"background:{diverging_color(v, vmax)};color:{text_color(v, vmax)}"
            pieces.append(f'<span class="{" ".join(classes)}" style="{style}" title="{_esc(title)}">'
                          f"{_token_html(t.text)}</span>")
        body.append(f'<span class="seg s{seg.idx % 2}" title="{_esc(seg_title)}">{"".join(pieces)}</span>')
    if not card.tokens:
        body = ['<span class="empty">(empty completion)</span>']
    note = "" if card.token_level else '<div class="sub">token texts unavailable: each segment is one piece, coloured by its mean token advantage</div>'
    completion = f'<div class="completion">{"".join(body)}</div>'
    svg = _value_svg(card) if card.has_values else ""

    fw_seg = card.first_wrong_segment
    rows = []
    for seg in card.segments:
        cls = ' class="fwrow"' if seg.idx == fw_seg else ""
        cstyle = f"background:{diverging_color(seg.credit, vmax)};color:{text_color(seg.credit, vmax)}"
        rows.append(
            f"<tr{cls}><td>{seg.idx}</td><td>{seg.token_start}–{seg.token_end}</td>"
            f'<td style="{cstyle}">{_fmt(seg.credit)}</td><td>{_fmt(seg.value)}</td>'
            f'<td class="txt">{_esc(seg.text.replace(chr(10), chr(0x21B5)))}</td></tr>'
        )
    table = ('<details><summary>segments</summary><table class="segs"><tr><th>k</th><th>tokens</th>'
             f'<th>credit</th><th>V(S_k)</th><th>text</th></tr>{"".join(rows)}</table></details>')
    cls = "correct" if card.correct else "incorrect"
    return f'<section class="card {cls}">{head}{prompt}{note}{completion}{svg}{table}</section>'


def render_html(
    cards: Sequence[Card],
    title: str | None = None,
    subtitle: str | None = None,
    color_by: str = "advantage",
) -> str:
    """A self-contained HTML page (inline CSS and SVG, no scripts or external references).

    ``color_by``: ``advantage`` colours each token by its token advantage, ``credit`` by its
    segment's credit. The scale is symmetric and shared by every card of the page.
    """
    if color_by not in COLOR_BY:
        raise ValueError(f"unknown color_by={color_by!r}; expected one of {', '.join(COLOR_BY)}")
    method = next((c.method for c in cards if c.method), "")
    title = title or f"rredcot heatmap{' · ' + method if method else ''}"
    vmax = page_scale(cards, color_by)
    n_ok = sum(c.correct for c in cards)
    sub = subtitle or ""
    sub = (f"{_esc(sub)} · " if sub else "") + (
        f"{len(cards)} completions ({n_ok} correct, {len(cards) - n_ok} incorrect) · "
        f"colour scale ±{vmax:.3g}"
    )
    body = "".join(_card_html(c, vmax, color_by) for c in cards) or '<p class="empty">no completions selected</p>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p class=\"sub\">{sub}</p>"
        f"{_legend(vmax, color_by)}{body}</body></html>\n"
    )
