"""Split a completion's tokens into segments: pure functions, no model.

A segmenter returns half-open token spans ``[(start, end), ...]`` that tile the completion
exactly: the first starts at 0, each starts where the previous ended, the last ends at the
number of tokens, and none is empty (an empty completion gets the single span (0, 0)). The final
answer therefore always sits in the last segment.

Every rule has the same signature::

    rule(token_texts, *, entropies=None, **fields)

``token_texts[i]`` is token i decoded alone (a character for the embedded char-level model, a
multi-character piece for BPE tokenizers), ``entropies[i]`` the entropy of the next-token
distribution that token i was sampled from (only ``entropy`` and ``hybrid`` read it; see
:func:`needs_entropy`), and ``fields`` every field of the typed ``SegmentConfig`` settings but
``name`` (:func:`rule_and_options`); a rule takes the fields it uses as keyword parameters and
ignores the rest. Every rule honours ``min_tokens``
(no segment shorter than that unless it is the only one) and ``max_segments``.

Rules (``segment=NAME``):

* ``fixed``: every ``tokens`` tokens.
* ``newline``: after line breaks and sentence ends, never inside math (VinePPO-style steps).
* ``keyword``: before discourse markers ("Wait", "So", ...) that start a line or a sentence.
* ``entropy``: at high-entropy "forking" tokens (Wang et al. 2025, "Beyond the 80/20 rule").
* ``hybrid``: keyword boundaries ranked by entropy, plus entropy cuts in long keyword-free spans.

Text rules work on the concatenated text with a character -> token map and put every boundary at
a token start.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from rredcot_cli.config.schema import SegmentConfig

Spans = list[tuple[int, int]]

# Discourse markers that start a new reasoning move in R1/Qwen3-style traces. Keep in sync with
# the default of ``SegmentConfig.keywords`` (a test checks).
DEFAULT_KEYWORDS: tuple[str, ...] = (
    "Wait", "Alternatively", "Let me", "So", "Therefore", "Thus", "But", "Hmm", "Now", "Next",
    "First", "Then", "Finally", "Hence", "However", "Actually", "Check", "Answer",
)  # fmt: skip

_SENTENCE_END = ".?!"


def spans_from_boundaries(num_tokens: int, boundaries: Sequence[int]) -> Spans:
    """Boundaries are token indices where a new segment starts (0 and num_tokens implied)."""
    if num_tokens == 0:
        return [(0, 0)]
    cuts = sorted({b for b in boundaries if 0 < b < num_tokens})
    starts = [0, *cuts]
    ends = [*cuts, num_tokens]
    return list(zip(starts, ends))


def enforce_limits(spans: Spans, min_tokens: int, max_segments: int) -> Spans:
    """Merge segments shorter than ``min_tokens`` into a neighbour, then merge the shortest
    adjacent pair until at most ``max_segments`` remain. Tiling is preserved by construction."""
    spans = list(spans)
    max_segments = max(1, max_segments)

    def merge(i: int) -> None:
        # Merge span i with its shorter neighbour (the previous one at the end of the list).
        if len(spans) == 1:
            return
        if i == 0:
            j = 1
        elif i == len(spans) - 1:
            j = i - 1
        else:
            prev_len = spans[i - 1][1] - spans[i - 1][0]
            next_len = spans[i + 1][1] - spans[i + 1][0]
            j = i - 1 if prev_len <= next_len else i + 1
        a, b = sorted((i, j))
        spans[a : b + 1] = [(spans[a][0], spans[b][1])]

    while len(spans) > 1:
        short = [i for i, (s, e) in enumerate(spans) if e - s < min_tokens]
        if not short:
            break
        merge(min(short, key=lambda i: spans[i][1] - spans[i][0]))
    while len(spans) > max_segments:
        merge(min(range(len(spans)), key=lambda i: spans[i][1] - spans[i][0]))
    return spans


def select_boundaries(
    num_tokens: int,
    ranked: Sequence[int],
    min_tokens: int,
    max_segments: int,
    chosen: Sequence[int] = (),
) -> list[int]:
    """Add boundaries from ``ranked`` (best first) to ``chosen`` greedily, skipping any that would
    leave a segment shorter than ``min_tokens``, until there are ``max_segments`` segments.
    Returns the sorted cut points including 0 and ``num_tokens``. Lower-ranked boundaries are the
    ones dropped when there are too many."""
    cuts = sorted({0, num_tokens, *(b for b in chosen if 0 < b < num_tokens)})
    max_segments = max(1, max_segments)
    for b in ranked:
        if len(cuts) - 1 >= max_segments:
            break
        if not 0 < b < num_tokens:
            continue
        pos = bisect.bisect_left(cuts, b)
        if cuts[pos] == b or b - cuts[pos - 1] < min_tokens or cuts[pos] - b < min_tokens:
            continue
        cuts.insert(pos, b)
    return cuts


def _spans_from_cuts(cuts: list[int]) -> Spans:
    return list(zip(cuts, cuts[1:])) if len(cuts) > 1 else [(0, 0)]


# --------------------------------------------------------------------------------------------
# Text helpers: char -> token map, protected (math / brace) regions, separators, keywords.


class _Text:
    """The concatenated completion, where each token starts in it, and where a boundary may go."""

    def __init__(self, token_texts: Sequence[str]):
        self.text = "".join(token_texts)
        self.starts: list[int] = []
        offset = 0
        for piece in token_texts:
            self.starts.append(offset)
            offset += len(piece)
        self.num_tokens = len(token_texts)
        self._allowed = _allowed_cuts(self.text)
        stripped = self.text.lstrip()
        self._first_content = len(self.text) - len(stripped)  # first non-space character

    def allowed(self, char: int) -> bool:
        """May a segment start at character ``char`` (not strictly inside math or a {...} group)?"""
        return self._allowed[char]

    def token_at(self, char: int, *, whitespace_prefix_only: bool) -> int:
        """The token index at which a segment starting at character ``char`` begins.

        If ``char`` is a token start, that token (the first of several empty ones). Otherwise
        ``char`` lies inside token t: the boundary goes to t when ``whitespace_prefix_only`` is
        False or the part of t before ``char`` is whitespace, else to t + 1."""
        if char >= len(self.text):
            return self.num_tokens
        t = bisect.bisect_right(self.starts, char) - 1
        if self.starts[t] == char:
            return bisect.bisect_left(self.starts, char)
        if not whitespace_prefix_only or self.text[self.starts[t] : char].isspace():
            return t
        return t + 1

    def ok(self, token: int) -> bool:
        """A usable boundary: inside the completion, after some non-space text (a leading run of
        whitespace is not a segment of its own), and at an allowed character."""
        return (
            0 < token < self.num_tokens
            and self.starts[token] > self._first_content
            and self.allowed(self.starts[token])
        )


def _find_close(text: str, delim: str, start: int, single_line: bool) -> int:
    """Index of the first unescaped ``delim`` at or after ``start``, or -1 (also -1 at a line
    break when ``single_line``)."""
    k = start
    while k < len(text):
        if text.startswith(delim, k):
            return k
        if single_line and text[k] == "\n":
            return -1
        k += 2 if text[k] == "\\" else 1
    return -1


def _allowed_cuts(text: str) -> list[bool]:
    """``allowed[c]`` for c in 0..len(text): False when c is strictly inside a math span
    (``$...$`` and ``\\(...\\)`` on one line, ``$$...$$``, ``\\[...\\]``) or a ``{...}``
    group closed on the same line. An opening delimiter that is never closed is a literal
    character, so one stray "$" or "{" does not freeze the rest of the completion."""
    intervals: list[tuple[int, int]] = []
    braces: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt in ("(", "["):
                close = "\\)" if nxt == "(" else "\\]"
                j = _find_close(text, close, i + 2, single_line=nxt == "(")
                if j >= 0:
                    intervals.append((i, j + 2))
                    i = j + 2
                    continue
            i += 2  # an escaped character (\$, \{, \\, ...) is literal
            continue
        if ch == "$":
            display = text.startswith("$$", i)
            close = "$$" if display else "$"
            j = _find_close(text, close, i + len(close), single_line=not display)
            if j >= 0:
                intervals.append((i, j + len(close)))
                i = j + len(close)
                continue
            i += len(close)
            continue
        if ch == "\n":
            braces.clear()  # a {...} group does not span lines (display math is handled above)
        elif ch == "{":
            braces.append(i)
        elif ch == "}" and braces:
            intervals.append((braces.pop(), i + 1))
        i += 1
    depth = [0] * (n + 2)
    for a, b in intervals:
        depth[a + 1] += 1  # cuts a+1 .. b-1 are inside
        depth[b] -= 1
    allowed, inside = [], 0
    for c in range(n + 1):
        inside += depth[c]
        allowed.append(inside == 0)
    return allowed


# A line break, or a sentence end (., ? or ! followed by whitespace), plus the whitespace after it.
_SEPARATOR = re.compile(r"(\n|[.?!](?=\s))\s*")


def _separator_boundaries(t: _Text) -> list[int]:
    """Token boundaries after line breaks and sentence ends: the next segment starts at the first
    non-space character after the separator. A sentence end followed (on the same line) by a
    lowercase letter is not a boundary ("e.g. the", "i.e. we")."""
    out = []
    text = t.text
    for m in _SEPARATOR.finditer(text):
        c = m.end()
        if c >= len(text) or not t.allowed(c):
            continue
        if m.group(1) != "\n" and "\n" not in m.group(0) and text[c].islower():
            continue
        b = t.token_at(c, whitespace_prefix_only=True)
        if t.ok(b):
            out.append(b)
    return out


def _keyword_regex(keywords: Sequence[str]) -> re.Pattern[str] | None:
    words = sorted({k for k in keywords if k}, key=len, reverse=True)
    if not words:
        return None
    parts = []
    for k in words:
        head = r"(?<!\w)" if re.match(r"\w", k[0]) else ""
        tail = r"(?!\w)" if re.match(r"\w", k[-1]) else ""
        parts.append(head + re.escape(k) + tail)
    return re.compile("|".join(parts))


def _keyword_boundaries(t: _Text, keywords: Sequence[str] | str, anywhere: bool) -> list[int]:
    """Token indices of the first token of each keyword occurrence that starts a line or follows a
    sentence end (or any whole-word occurrence when ``anywhere``), outside math."""
    if isinstance(keywords, str):
        keywords = [keywords]
    rx = _keyword_regex(list(keywords))
    if rx is None:
        return []
    text = t.text
    out = []
    for m in rx.finditer(text):
        c = m.start()
        if not anywhere and c > 0:
            k = c
            while k > 0 and text[k - 1].isspace():
                k -= 1
            gap = text[k:c]
            if not ("\n" in gap or (gap and text[k - 1] in _SENTENCE_END)):
                continue
        if not t.allowed(c):
            continue
        b = t.token_at(c, whitespace_prefix_only=False)
        if t.ok(b):
            out.append(b)
    return sorted(set(out))


def _check_entropies(rule: str, token_texts: Sequence[str], entropies: Sequence[float] | None) -> list[float]:
    if entropies is None:
        raise ValueError(
            f"segment={rule} needs per-token entropies (entropies=[...], one per completion token), "
            "got None; use segment=newline or segment=keyword when entropies are not available"
        )
    values = [float(x) for x in entropies]
    if len(values) != len(token_texts):
        raise ValueError(
            f"segment={rule}: got {len(values)} entropies for {len(token_texts)} tokens; need one per token"
        )
    return [-math.inf if math.isnan(v) else v for v in values]  # NaN never wins a ranking


def _by_entropy(indices: Sequence[int], entropies: Sequence[float]) -> list[int]:
    """Indices sorted by entropy, highest first; ties go to the earlier token."""
    return sorted(indices, key=lambda i: (-entropies[i], i))


# --------------------------------------------------------------------------------------------
# Rules.


def fixed(
    token_texts: list[str],
    *,
    entropies: list[float] | None = None,
    tokens: int,
    min_tokens: int,
    max_segments: int,
    **_: object,
) -> Spans:
    """Every ``tokens`` tokens; the remainder joins the last segment if shorter than min_tokens."""
    if tokens < 1:
        raise ValueError(f"segment.tokens must be >= 1, got {tokens}")
    n = len(token_texts)
    return enforce_limits(spans_from_boundaries(n, list(range(tokens, n, tokens))), min_tokens, max_segments)


def newline(
    token_texts: list[str],
    *,
    entropies: list[float] | None = None,
    min_tokens: int,
    max_segments: int,
    **_: object,
) -> Spans:
    """Reasoning steps (as VinePPO splits them): a new segment starts after every line break and
    every sentence end (".", "?" or "!" followed by whitespace, unless a lowercase word follows on
    the same line), at the first token of the next non-space text. No boundary falls inside
    ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]`` or a ``{...}`` group; fragments shorter
    than ``min_tokens`` merge into a neighbour."""
    t = _Text(token_texts)
    return enforce_limits(spans_from_boundaries(t.num_tokens, _separator_boundaries(t)), min_tokens, max_segments)


def keyword(
    token_texts: list[str],
    *,
    entropies: list[float] | None = None,
    min_tokens: int,
    max_segments: int,
    keywords: Sequence[str] = DEFAULT_KEYWORDS,
    keyword_anywhere: bool = False,
    **_: object,
) -> Spans:
    """A new segment starts at each discourse marker in ``keywords`` (case-sensitive, whole word)
    that begins a line or follows a sentence end, or anywhere when ``keyword_anywhere``; the
    keyword's first token starts the segment. Never inside math; short segments merge."""
    t = _Text(token_texts)
    bounds = _keyword_boundaries(t, keywords, keyword_anywhere)
    return enforce_limits(spans_from_boundaries(t.num_tokens, bounds), min_tokens, max_segments)


def entropy(
    token_texts: list[str],
    *,
    entropies: list[float] | None = None,
    min_tokens: int,
    max_segments: int,
    entropy_quantile: float = 0.9,
    entropy_threshold: float | None = None,
    **_: object,
) -> Spans:
    """A new segment starts at each high-entropy "forking" token: the top ``1 - entropy_quantile``
    share of the completion's tokens by entropy (0.9: top 10%, at least one token when the share
    is positive), or every token above ``entropy_threshold`` when that is set. Highest-entropy
    boundaries win: one that would leave a segment under ``min_tokens`` is skipped, and at most
    ``max_segments - 1`` are kept. Raises ValueError without ``entropies``."""
    h = _check_entropies("entropy", token_texts, entropies)
    n = len(h)
    if entropy_threshold is not None:
        candidates = [i for i in range(n) if h[i] > entropy_threshold]
    else:
        if not 0.0 <= entropy_quantile <= 1.0:
            raise ValueError(f"segment.entropy_quantile must be in [0, 1], got {entropy_quantile}")
        top = math.ceil((1.0 - entropy_quantile) * n - 1e-9)
        candidates = _by_entropy(range(n), h)[:top]
    cuts = select_boundaries(n, _by_entropy(candidates, h), min_tokens, max_segments)
    return _spans_from_cuts(cuts)


def hybrid(
    token_texts: list[str],
    *,
    entropies: list[float] | None = None,
    min_tokens: int,
    max_segments: int,
    keywords: Sequence[str] = DEFAULT_KEYWORDS,
    keyword_anywhere: bool = False,
    hybrid_max_span: int = 64,
    **_: object,
) -> Spans:
    """Keyword-entropy segmentation (the paper's choice). Keyword boundaries (as in ``keyword``)
    are ranked by the entropy at the keyword's first token and kept highest first (at most
    ``max_segments - 1``, none leaving a segment under ``min_tokens``). Then, while a segment is
    longer than ``hybrid_max_span`` tokens and fewer than ``max_segments`` exist, the longest such
    segment is cut at its highest-entropy token (keeping both parts >= ``min_tokens``).
    Raises ValueError without ``entropies``."""
    h = _check_entropies("hybrid", token_texts, entropies)
    if hybrid_max_span < 1:
        raise ValueError(f"segment.hybrid_max_span must be >= 1, got {hybrid_max_span}")
    t = _Text(token_texts)
    n = t.num_tokens
    max_segments = max(1, max_segments)
    ranked = _by_entropy(_keyword_boundaries(t, keywords, keyword_anywhere), h)
    cuts = select_boundaries(n, ranked, min_tokens, max_segments)
    margin = max(1, min_tokens)
    unsplittable: set[tuple[int, int]] = set()
    while len(cuts) - 1 < max_segments:
        long = [(s, e) for s, e in zip(cuts, cuts[1:]) if e - s > hybrid_max_span and (s, e) not in unsplittable]
        if not long:
            break
        s, e = max(long, key=lambda span: (span[1] - span[0], -span[0]))
        lo, hi = s + margin, e - margin
        if lo > hi:
            unsplittable.add((s, e))
            continue
        b = _by_entropy(range(lo, hi + 1), h)[0]
        bisect.insort(cuts, b)
    return _spans_from_cuts(cuts)


SEGMENTERS: dict[str, Callable[..., Spans]] = {
    "fixed": fixed,
    "newline": newline,
    "keyword": keyword,
    "entropy": entropy,
    "hybrid": hybrid,
}

_NEEDS_ENTROPY = frozenset({"entropy", "hybrid"})


def get_segmenter(name: str) -> Callable[..., Spans]:
    if name not in SEGMENTERS:
        raise KeyError(f"unknown segmenter {name!r}; valid: {', '.join(sorted(SEGMENTERS))}")
    return SEGMENTERS[name]


def rule_and_options(settings: SegmentConfig) -> tuple[Callable[..., Spans], dict]:
    """The rule ``settings.name`` and its keyword options: every other field of ``settings``."""
    options = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name != "name"}
    return get_segmenter(settings.name), options


def needs_entropy(name: str) -> bool:
    """Whether rule ``name`` reads per-token entropies (the stage must compute them).
    Raises KeyError for an unknown rule, like :func:`get_segmenter`."""
    get_segmenter(name)
    return name in _NEEDS_ENTROPY
