"""Credit heatmaps, the data: which completions to show and what each card holds.

Pure functions over artifact rows (lists of dicts, as ``pyarrow.Table.to_pylist`` gives them);
``rredcot_cli.stages.heatmap`` reads the artifacts and writes the files, rendered by
``rredcot_cli.report.heatmap_html`` (the page) and ``rredcot_cli.report.heatmap_png`` (the figure).

- ``select_samples(samples, count, select, prompt_ids, sample_idx)``: which completions to show.
- ``build_cards(samples, segments, credits, advantages, benchmark, ...)``: one ``Card`` per chosen
  completion: its tokens (text, advantage, segment), its segments (credit, value V(S_k)) and,
  where the benchmark checks steps (the synthetic ones), the first wrong step.
- ``align_token_spans(completion, texts)``: where each decoded token sits in the completion.

Token texts come from the caller (``token_texts``: per-completion lists of decoded token strings,
e.g. ``rredcot_cli.pipeline.token_texts``); without them each segment is shown as one piece.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from rredcot_cli.benchmarks.base import Problem

SELECT_MODES = ("mixed", "incorrect", "correct", "first")

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
