"""Split a completion's tokens into segments: pure functions, no model.

A segmenter returns half-open token spans ``[(start, end), ...]`` that tile the completion
exactly: the first starts at 0, each starts where the previous ended, the last ends at the
number of tokens, and none is empty (an empty completion gets the single span (0, 0)). The final
answer therefore always sits in the last segment.

Every rule takes the per-token texts (``token_texts[i]`` is token i decoded alone) and the limits
``min_tokens`` (shorter segments are merged into a neighbour) and ``max_segments``.
"""

from __future__ import annotations

from typing import Callable

Spans = list[tuple[int, int]]


def spans_from_boundaries(num_tokens: int, boundaries: list[int]) -> Spans:
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


def fixed(token_texts: list[str], *, tokens: int, min_tokens: int, max_segments: int) -> Spans:
    """Every ``tokens`` tokens; the remainder joins the last segment if shorter than min_tokens."""
    if tokens < 1:
        raise ValueError(f"segment.tokens must be >= 1, got {tokens}")
    n = len(token_texts)
    return enforce_limits(spans_from_boundaries(n, list(range(tokens, n, tokens))), min_tokens, max_segments)


def newline(token_texts: list[str], *, tokens: int, min_tokens: int, max_segments: int) -> Spans:
    """A new segment starts after every token that contains a line break."""
    boundaries = [i + 1 for i, text in enumerate(token_texts) if "\n" in text]
    return enforce_limits(spans_from_boundaries(len(token_texts), boundaries), min_tokens, max_segments)


SEGMENTERS: dict[str, Callable[..., Spans]] = {"fixed": fixed, "newline": newline}


def get_segmenter(name: str) -> Callable[..., Spans]:
    if name not in SEGMENTERS:
        raise KeyError(f"unknown segmenter {name!r}; valid: {', '.join(sorted(SEGMENTERS))}")
    return SEGMENTERS[name]
