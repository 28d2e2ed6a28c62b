"""Credit heatmaps: which segments of a completion helped and which were detours.

Pure functions over artifact rows (lists of dicts, as ``pyarrow.Table.to_pylist`` gives them);
``rredcot_cli.stages.heatmap`` reads the artifacts and writes the files.

- ``select_samples(samples, count, select, prompt_ids, sample_idx)``: which completions to show.
- ``build_cards(samples, segments, credits, advantages, benchmark, ...)``: one ``Card`` per chosen
  completion: its tokens (text, advantage, segment), its segments (credit, value V(S_k)) and,
  where the benchmark checks steps (the synthetic ones), the first wrong step.
- ``render_html(cards)``: one self-contained page (inline CSS and SVG; no scripts, fonts or links),
  tokens coloured on a diverging scale (red < 0 < blue, white at 0, symmetric, one scale per page).
- ``render_png(cards, path)``: the same as a matplotlib figure (Agg), one row per completion.

Token texts come from the caller (``token_texts``: per-completion lists of decoded token strings,
e.g. ``rredcot_cli.rollout.token_texts``); without them each segment is shown as one piece.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

SELECT_MODES = ("mixed", "incorrect", "correct", "first")
COLOR_BY = ("advantage", "credit")

# Diverging scale (ColorBrewer RdBu, white centre): index 0 is 0, the last entry is |v| = vmax.
_NEG = ["#ffffff", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"]
_POS = ["#ffffff", "#d1e5f0", "#92c5de", "#4393c3", "#2166ac"]
_FIRST_WRONG = "#111111"

Key = tuple  # (prompt_id, sample_idx)


class SelectionError(ValueError):
    """The selection options pick nothing, or name a mode or prompt that does not exist."""


# --------------------------------------------------------------------------- data


@dataclass
class Segment:
    idx: int
    token_start: int  # [token_start, token_end) into the completion's tokens
    token_end: int
    text: str
    credit: float
    value: float | None = None  # V(S_k) where the method has one


@dataclass
class Token:
    text: str  # what is shown: the completion's characters for this token where they align
    advantage: float  # the token advantage (mean over the segment when tokens are whole segments)
    segment_idx: int
    position: int  # token position in the completion (first token of the piece)
    char_start: int  # [char_start, char_end) in the completion; empty for e.g. an EOS token
    char_end: int
    first_wrong: bool = False  # inside the first wrong step
    special: bool = False  # shown text is not part of the completion string (e.g. "<|endoftext|>")


@dataclass
class Card:
    prompt_id: str
    sample_idx: int
    method: str
    prompt: str
    completion: str
    reward: float
    scorable: bool
    correct: bool
    gold_answer: str
    pred_answer: str | None
    benchmark: str
    finish_reason: str
    num_tokens: int
    token_advantages: list[float]
    segments: list[Segment]
    tokens: list[Token]
    token_level: bool  # False: no token texts were given, each Token is a whole segment
    first_wrong_step: int | None = None  # 0-based step index (None: all right, or unknown)
    first_wrong_chars: tuple[int, int] | None = None
    first_wrong_token_range: tuple[int, int] | None = None  # [start, end) token positions
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.prompt_id, self.sample_idx)

    @property
    def has_values(self) -> bool:
        return any(s.value is not None and math.isfinite(s.value) for s in self.segments)

    @property
    def first_wrong_segment(self) -> int | None:
        """Index of the segment where the first wrong step starts."""
        if self.first_wrong_token_range is None:
            return None
        start = self.first_wrong_token_range[0]
        for seg in self.segments:
            if seg.token_start <= start < seg.token_end:
                return seg.idx
        return self.segments[-1].idx if self.segments else None


# --------------------------------------------------------------------------- selection


def is_correct(row: Mapping[str, Any]) -> bool:
    """A samples row counts as correct when it was scorable and its reward is above 0.5."""
    return bool(row.get("scorable", True)) and float(row["reward"]) > 0.5


def _key(row: Mapping[str, Any]) -> Key:
    return (row["prompt_id"], int(row["sample_idx"]))


def _round_robin(lists: list[list[dict]]) -> list[dict]:
    """First item of every list, then every second item, ... (spreads picks over groups)."""
    out: list[dict] = []
    depth = 0
    while any(depth < len(items) for items in lists):
        out.extend(items[depth] for items in lists if depth < len(items))
        depth += 1
    return out


def select_samples(
    samples: Sequence[Mapping[str, Any]],
    count: int = 8,
    select: str = "mixed",
    prompt_ids: Sequence[str] | None = None,
    sample_idx: int | None = None,
) -> list[dict]:
    """The samples rows to show, in display order (completions of one prompt side by side).

    ``prompt_ids`` / ``sample_idx`` first restrict the candidates (and ``prompt_ids`` sets the
    prompt order); then ``select`` picks ``count`` of them:

    - ``mixed``: half incorrect (rounded up), half correct, one of each from every prompt whose
      group has both outcomes first, then from the other prompts; a short side is filled with the
      other outcome;
    - ``incorrect`` / ``correct``: only that outcome, prompts with mixed groups first;
    - ``first``: the first ``count`` rows in file order.

    Raises ``SelectionError`` (a ValueError) for an unknown mode, unknown prompt ids, or no
    candidates left.
    """
    if select not in SELECT_MODES:
        raise SelectionError(f"unknown heatmap.select={select!r}; expected one of {', '.join(SELECT_MODES)}")
    rows = [dict(r) for r in samples]
    if prompt_ids:
        wanted = list(dict.fromkeys(prompt_ids))
        present = {r["prompt_id"] for r in rows}
        missing = [p for p in wanted if p not in present]
        if missing:
            raise SelectionError(f"heatmap.prompt_ids not in the samples: {', '.join(missing[:5])}")
        rank = {p: i for i, p in enumerate(wanted)}
        rows = sorted((r for r in rows if r["prompt_id"] in rank), key=lambda r: rank[r["prompt_id"]])
    if sample_idx is not None:
        rows = [r for r in rows if int(r["sample_idx"]) == int(sample_idx)]
    if not rows:
        raise SelectionError("no completions match heatmap.prompt_ids / heatmap.sample_idx")
    count = max(0, int(count))
    if select == "first":
        return rows[:count]

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["prompt_id"], []).append(r)
    for members in groups.values():
        members.sort(key=lambda r: int(r["sample_idx"]))
    mixed = [p for p, m in groups.items() if len({is_correct(r) for r in m}) == 2]
    order = mixed + [p for p in groups if p not in set(mixed)]
    rank = {p: i for i, p in enumerate(order)}
    correct = _round_robin([[r for r in groups[p] if is_correct(r)] for p in order])
    incorrect = _round_robin([[r for r in groups[p] if not is_correct(r)] for p in order])

    if select == "correct":
        picked = correct[:count]
    elif select == "incorrect":
        picked = incorrect[:count]
    else:
        n_incorrect = min(len(incorrect), (count + 1) // 2)
        n_correct = min(len(correct), count - n_incorrect)
        n_incorrect = min(len(incorrect), count - n_correct)  # fill a short side with the other
        picked = incorrect[:n_incorrect] + correct[:n_correct]
    return sorted(picked, key=lambda r: (rank[r["prompt_id"]], not is_correct(r), int(r["sample_idx"])))


# --------------------------------------------------------------------------- cards


def align_token_spans(completion: str, texts: Sequence[str]) -> list[tuple[int, int, bool]]:
    """Character span ``(start, end, special)`` of each token text in ``completion``.

    Tokens are matched left to right. A token whose text is not at the cursor (a piece of a
    multi-byte character decoded alone, shown as U+FFFD, or a special token such as EOS) is held
    until a later token matches again; the characters skipped meanwhile go to the first held
    token, and held tokens left at the end get empty spans and are marked ``special``. Characters
    of ``completion`` that no token covers at the end are given to the last token.
    """
    spans: list[tuple[int, int, bool] | None] = [None] * len(texts)
    pos = 0
    pending: list[int] = []

    def settle(upto: int) -> None:
        nonlocal pos
        for n, i in enumerate(pending):
            spans[i] = (pos, upto, False) if n == 0 else (upto, upto, False)
        pos = upto if pending else pos
        pending.clear()

    for i, text in enumerate(texts):
        if text and completion.startswith(text, pos):
            settle(pos)
            spans[i] = (pos, pos + len(text), False)
            pos += len(text)
            continue
        if not text:
            spans[i] = (pos, pos, False)
            continue
        if "\ufffd" not in text and pending:
            found = completion.find(text, pos, pos + len(text) + 8 * len(pending))
            if found >= 0:
                settle(found)
                spans[i] = (pos, pos + len(text), False)
                pos += len(text)
                continue
        pending.append(i)
    if pending:
        if pos < len(completion):
            settle(len(completion))
        else:
            for i in pending:
                spans[i] = (pos, pos, True)
            pending.clear()
    out = [s if s is not None else (pos, pos, True) for s in spans]
    if out and pos < len(completion):
        start, _, _ = out[-1]
        out[-1] = (min(start, pos), len(completion), False)
    return out


def _question(row: Mapping[str, Any]) -> str:
    return str(row.get("prompt") or "").strip()


def _first_wrong(benchmark: Any, row: Mapping[str, Any]) -> tuple[int | None, tuple[int, int] | None]:
    """(step index, char span) of the first wrong step, or (None, None) where unknown or all right."""
    if benchmark is None or not hasattr(benchmark, "first_wrong_step") or not hasattr(benchmark, "step_char_spans"):
        return None, None
    name = getattr(benchmark, "name", None)
    if name is not None and row.get("benchmark") not in (None, name):
        return None, None
    from rredcot_cli.benchmarks.base import Problem

    try:
        meta = json.loads(row.get("meta") or "{}")
        problem = Problem(prompt_id=row["prompt_id"], question=_question(row),
                          gold_answer=str(row["gold_answer"]), meta=meta)
        completion = row["completion"]
        step = benchmark.first_wrong_step(completion, problem)
        if step is None:
            return None, None
        spans = list(benchmark.step_char_spans(completion))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None, None
    step = int(step)
    if step < len(spans):
        return step, (int(spans[step][0]), int(spans[step][1]))
    # A missing step (the chain stops, or answers, too early): mark what follows the last step.
    start = spans[-1][1] if spans else 0
    end = len(completion)
    if start >= end:  # nothing follows: mark the last character
        start = max(0, end - 1)
    return step, (start, end)


def _finite(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def build_cards(
    samples: Sequence[Mapping[str, Any]],
    segments: Sequence[Mapping[str, Any]],
    credits: Sequence[Mapping[str, Any]],
    advantages: Sequence[Mapping[str, Any]],
    benchmark: Any = None,
    select: str = "mixed",
    count: int = 8,
    prompt_ids: Sequence[str] | None = None,
    sample_idx: int | None = None,
    token_texts: Mapping[Key, Sequence[str]] | Callable[[dict], Sequence[str] | None] | None = None,
    method: str | None = None,
) -> list[Card]:
    """One ``Card`` per chosen completion (see ``select_samples`` for ``select``/``count``/filters).

    Rows follow the artifact schemas. Only completions that have segments, credits and
    advantages are candidates. ``benchmark``: an object with ``first_wrong_step`` and
    ``step_char_spans`` (the synthetic benchmarks) to mark the first wrong step, applied to rows
    whose ``benchmark`` column names it. ``token_texts``: per completion, its tokens decoded one
    by one, as a mapping ``(prompt_id, sample_idx) -> list[str]`` or a function of the samples
    row (called only for chosen rows); missing: each segment is shown as one piece.
    Raises ValueError when the artifacts do not fit together (lengths, segment tiling).
    """
    seg_by: dict[Key, list[Mapping[str, Any]]] = defaultdict(list)
    for s in segments:
        seg_by[_key(s)].append(s)
    cred_by: dict[Key, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for c in credits:
        cred_by[_key(c)][int(c["segment_idx"])] = c
    adv_by = {_key(a): a for a in advantages}
    if method is None:
        method = next((str(a.get("method")) for a in advantages if a.get("method")), "")

    candidates = [r for r in samples if _key(r) in seg_by and _key(r) in cred_by and _key(r) in adv_by]
    if not candidates:
        raise ValueError("no completion has segments, credits and advantages")
    chosen = select_samples(candidates, count=count, select=select, prompt_ids=prompt_ids, sample_idx=sample_idx)

    cards = []
    for row in chosen:
        key = _key(row)
        ids = list(row["completion_token_ids"])
        n = len(ids)
        adv = [_finite(x) for x in adv_by[key]["token_advantages"]]
        if len(adv) != n:
            raise ValueError(f"{key}: {len(adv)} token advantages for {n} completion tokens")
        segs = []
        for s in sorted(seg_by[key], key=lambda s: int(s["segment_idx"])):
            k = int(s["segment_idx"])
            c = cred_by[key].get(k)
            if c is None:
                raise ValueError(f"{key}: segment {k} has no credit row")
            value = c.get("value")
            value = None if value is None or not math.isfinite(float(value)) else float(value)
            segs.append(Segment(k, int(s["token_start"]), int(s["token_end"]), str(s.get("text") or ""),
                                _finite(c["credit"]), value))
        if segs[0].token_start != 0 or segs[-1].token_end != n or any(
            a.token_end != b.token_start for a, b in zip(segs, segs[1:])
        ):
            raise ValueError(f"{key}: segments do not tile the {n} completion tokens")

        texts = None
        if callable(token_texts):
            texts = token_texts(dict(row))
        elif token_texts is not None:
            texts = token_texts.get(key)
        completion = str(row["completion"])
        if texts is not None:
            texts = [str(t) for t in texts]
            if len(texts) != n:
                raise ValueError(f"{key}: {len(texts)} token texts for {n} completion tokens")
            seg_of = [0] * n
            for seg in segs:
                for i in range(seg.token_start, seg.token_end):
                    seg_of[i] = seg.idx
            tokens = [
                Token(completion[a:b] if b > a else ("" if "\ufffd" in t else t), adv[i], seg_of[i], i, a, b,
                      special=special or (b <= a and bool(t) and "\ufffd" not in t))
                for i, (t, (a, b, special)) in enumerate(zip(texts, align_token_spans(completion, texts)))
            ]
        else:
            spans = align_token_spans(completion, [s.text for s in segs])
            tokens = []
            for seg, (a, b, special) in zip(segs, spans):
                part = adv[seg.token_start:seg.token_end]
                mean = sum(part) / len(part) if part else seg.credit
                shown = completion[a:b] if b > a else seg.text
                tokens.append(Token(shown, mean, seg.idx, seg.token_start, a, b, special=special))

        step, chars = _first_wrong(benchmark, row)
        token_range = None
        if chars is not None:
            s0, s1 = chars
            hit = [t for t in tokens if t.char_end > t.char_start and t.char_start < s1 and t.char_end > s0]
            if not hit and tokens:
                hit = [tokens[-1]]
            for t in hit:
                t.first_wrong = True
            if hit:
                seg_end = {seg.idx: seg.token_end for seg in segs}
                last = hit[-1]
                end = last.position + 1 if texts is not None else seg_end[last.segment_idx]
                token_range = (hit[0].position, end)
        try:
            meta = json.loads(row.get("meta") or "{}")
        except (TypeError, ValueError):
            meta = {}
        cards.append(
            Card(
                prompt_id=str(row["prompt_id"]), sample_idx=int(row["sample_idx"]), method=method,
                prompt=str(row.get("prompt") or ""), completion=completion, reward=_finite(row["reward"]),
                scorable=bool(row.get("scorable", True)), correct=is_correct(row),
                gold_answer=str(row.get("gold_answer") or ""), pred_answer=row.get("pred_answer"),
                benchmark=str(row.get("benchmark") or ""), finish_reason=str(row.get("finish_reason") or ""),
                num_tokens=n, token_advantages=adv, segments=segs, tokens=tokens,
                token_level=texts is not None, first_wrong_step=step, first_wrong_chars=chars,
                first_wrong_token_range=token_range, meta=meta if isinstance(meta, dict) else {},
            )
        )
    return cards


# --------------------------------------------------------------------------- colours


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


def _text_color(value: float, vmax: float) -> str:
    return "#ffffff" if vmax > 0 and math.isfinite(value) and abs(value) / vmax > 0.72 else "#111111"


def colormap():
    """The same diverging scale as a matplotlib colormap (from -vmax to +vmax)."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("rredcot_diverging", list(reversed(_NEG)) + _POS[1:])


def _token_value(card: Card, token: Token, color_by: str) -> float:
    if color_by == "credit":
        return card.segments[token.segment_idx].credit if token.segment_idx < len(card.segments) else 0.0
    return token.advantage


def page_scale(cards: Sequence[Card], color_by: str = "advantage") -> float:
    """Symmetric scale of a page: the largest |value| coloured on it (1.0 when all are 0)."""
    values = [abs(_token_value(c, t, color_by)) for c in cards for t in c.tokens]
    values += [abs(s.credit) for c in cards for s in c.segments]
    vmax = max((v for v in values if math.isfinite(v)), default=0.0)
    return vmax if vmax > 0 else 1.0


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:+.3f}"


# --------------------------------------------------------------------------- HTML

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
                   f'stroke="{_FIRST_WRONG}" stroke-width="1.5" stroke-dasharray="4 3"/>')
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
            v = _token_value(card, t, color_by)
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
            style = f"background:{diverging_color(v, vmax)};color:{_text_color(v, vmax)}"
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
        cstyle = f"background:{diverging_color(seg.credit, vmax)};color:{_text_color(seg.credit, vmax)}"
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


# --------------------------------------------------------------------------- PNG


def render_png(cards: Sequence[Card], path: str | Path, title: str | None = None, dpi: int = 110) -> Path:
    """Write a PNG: one row per card, segments as blocks coloured by credit along token position
    (a thin strip below shows token advantages), V(S_k) overlaid where the method has values,
    the first wrong step framed, and a colorbar. Uses matplotlib's Agg canvas (no pyplot state)."""
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
                        family="monospace", color=_text_color(seg.credit, vmax), clip_on=True)
        ax.imshow([card.token_advantages], extent=(0, card.num_tokens, 0.0, 0.2), aspect="auto",
                  cmap=cmap, norm=norm, interpolation="nearest")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, 1)
        if card.first_wrong_token_range is not None:
            a, b = card.first_wrong_token_range
            ax.add_patch(Rectangle((a, 0.0), max(b - a, 0.5), 1.0, fill=False, edgecolor=_FIRST_WRONG,
                                   linewidth=2.0, zorder=5))
            ax.plot([a], [1.0], marker="v", color=_FIRST_WRONG, markersize=6, clip_on=False, zorder=6)
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
