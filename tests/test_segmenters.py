"""Segmenters tile the completion exactly, for every rule, on arbitrary token texts."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot_cli.config.schema import SegmentConfig
from rredcot_cli.segmenters import (
    DEFAULT_KEYWORDS,
    SEGMENTERS,
    enforce_limits,
    entropy,
    fixed,
    get_segmenter,
    hybrid,
    keyword,
    needs_entropy,
    newline,
)

# Single characters, BPE-like multi-character pieces, math delimiters, keywords, separators.
VOCAB = [
    "a", "1", "+", "=", " ", "\n", "x\n", ".", ". ", "? ", "!", " the", "The", ".\n\n", ":", " 7", "",
    "Wait", " Wait", "So", " So", "Sol", "Let me", "Answer", " Hmm", "But",
    "$", "$$", "\\(", "\\)", "\\[", "\\]", "{", "}", "\\", "\\frac",
]  # fmt: skip
token_texts = st.lists(st.sampled_from(VOCAB), max_size=300)
entropy_values = st.one_of(st.floats(0.0, 8.0), st.just(math.nan), st.sampled_from([0.0, 1.0, 2.0]))


def assert_tiles(spans, n):
    assert spans[0][0] == 0
    assert spans[-1][1] == n
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert e0 == s1
    if n:
        assert all(e > s for s, e in spans)
    else:
        assert spans == [(0, 0)]


def assert_limits(spans, min_tokens, max_segments):
    assert len(spans) <= max_segments
    if len(spans) > 1:
        assert all(e - s >= min_tokens for s, e in spans)


def seg(rule, texts, entropies=None, **fields):
    """Call a rule the way the stage does: every SegmentConfig field but name as a keyword."""
    kwargs = {k: v for k, v in dataclasses.asdict(SegmentConfig()).items() if k != "name"}
    kwargs.update(fields)
    return SEGMENTERS[rule](texts, entropies=entropies, **kwargs)


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    texts=token_texts,
    rule=st.sampled_from(sorted(SEGMENTERS)),
    tokens=st.integers(1, 50),
    min_tokens=st.integers(0, 20),
    max_segments=st.integers(1, 60),
    keyword_anywhere=st.booleans(),
    keywords=st.one_of(st.just(list(DEFAULT_KEYWORDS)), st.lists(st.sampled_from(["Wait", "So", "Let me", "$", ""]))),
    entropy_quantile=st.floats(0.0, 1.0),
    entropy_threshold=st.one_of(st.none(), st.floats(0.0, 8.0)),
    hybrid_max_span=st.integers(1, 100),
)
def test_every_rule_tiles(data, texts, rule, tokens, min_tokens, max_segments, keyword_anywhere, keywords,
                          entropy_quantile, entropy_threshold, hybrid_max_span):  # fmt: skip
    entropies = data.draw(st.lists(entropy_values, min_size=len(texts), max_size=len(texts)))
    spans = seg(
        rule, texts, entropies, tokens=tokens, min_tokens=min_tokens, max_segments=max_segments,
        keyword_anywhere=keyword_anywhere, keywords=keywords, entropy_quantile=entropy_quantile,
        entropy_threshold=entropy_threshold, hybrid_max_span=hybrid_max_span,
    )  # fmt: skip
    assert_tiles(spans, len(texts))
    assert_limits(spans, min_tokens, max_segments)
    if rule == "hybrid" and len(spans) < max_segments:
        # Every segment still over the span limit is too short to cut into two >= min_tokens parts.
        assert all(e - s < 2 * max(1, min_tokens) for s, e in spans if e - s > hybrid_max_span)


PLAIN = ["So it is 3. ", "Wait", "\n", "Then x. ", " y", "? ", "Hmm.\n\n"]
MATH = ["$a. B$", "$$x.\nSo y$$", "\\(p? Q\\)", "\\[u.\n Wait v\\]", "{c. D}", "{1. A{So 2}}"]


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.one_of(st.sampled_from(PLAIN), st.sampled_from(MATH)), max_size=30),
    cuts=st.sets(st.integers(1, 400)),
    rule=st.sampled_from(["newline", "keyword"]),
    anywhere=st.booleans(),
)
def test_text_rules_never_cut_inside_math(pieces, cuts, rule, anywhere):
    text = "".join(pieces)
    # Any tokenization: characters grouped at random cut points.
    points = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    texts = [text[a:b] for a, b in zip(points, points[1:]) if b > a]
    protected, offset = [], 0
    for piece in pieces:
        if piece in MATH:
            protected.append((offset, offset + len(piece)))
        offset += len(piece)
    starts = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    spans = seg(rule, texts, min_tokens=0, keyword_anywhere=anywhere)
    assert_tiles(spans, len(texts))
    for s, _ in spans[1:]:
        assert not any(a < starts[s] < b for a, b in protected), (text, starts[s])


# ---------------------------------------------------------------------------------- newline


def test_newline_by_hand():
    texts = list("1+2=3\n3+4=7\nAnswer: 7") + ["<eos>"]
    spans = newline(texts, tokens=0, min_tokens=1, max_segments=40)
    assert spans == [(0, 6), (6, 12), (12, len(texts))]


def test_newline_splits_sentence_ends():
    text = "It is 3. So x=4? Yes! Done"
    spans = seg("newline", list(text), min_tokens=1)
    assert [text[s:e] for s, e in spans] == ["It is 3. ", "So x=4? ", "Yes! ", "Done"]
    # Not a sentence end: no whitespace after the period, or a lowercase word follows on the line.
    text = "x=3.5 and e.g. the value"
    assert seg("newline", list(text), min_tokens=1) == [(0, len(text))]


def test_newline_does_not_split_inside_math():
    for math_span in ["$a. B$", "$$a.\nB$$", "\\(a. B\\)", "\\[a.\nB\\]", "\\frac{a. B}{c}"]:
        text = f"Let {math_span} hold.\nNext line"
        spans = seg("newline", list(text), min_tokens=1)
        assert [text[s:e] for s, e in spans] == [f"Let {math_span} hold.\n", "Next line"], math_span
    # A "{" closed only on a later line, a stray "$" (never closed on its line) or an escaped one
    # protects nothing.
    text = "Set {a.\nB} now"
    assert [text[s:e] for s, e in seg("newline", list(text), min_tokens=1)] == ["Set {a.\n", "B} now"]
    text = "It costs \\$5. Then $6. More"
    assert [text[s:e] for s, e in seg("newline", list(text), min_tokens=1)] == [
        "It costs \\$5. ",
        "Then $6. ",
        "More",
    ]


def test_newline_multichar_tokens_cut_at_token_starts():
    texts = ["First", " step", ".", " Then", " more", ".\n\n", "Answer", ":", " 5"]
    assert seg("newline", texts, min_tokens=1) == [(0, 3), (3, 6), (6, 9)]
    # A leading blank line is not a segment of its own.
    assert seg("newline", ["\n", "\n", "So", " 5"], min_tokens=1) == [(0, 4)]


def test_newline_merges_short_fragments():
    text = "A. B is long enough. C is too. D"
    spans = seg("newline", list(text), min_tokens=4)
    # "A. " (3 tokens) joins the next sentence, "D" the previous one.
    assert [text[s:e] for s, e in spans] == ["A. B is long enough. ", "C is too. D"]


# ---------------------------------------------------------------------------------- keyword


def test_keyword_splits_before_markers_at_line_or_sentence_start():
    text = "I think 5.\nWait, that is wrong. So it is 6. I said So. Solution: 6"
    spans = seg("keyword", list(text), min_tokens=1)
    assert [text[s:e] for s, e in spans] == [
        "I think 5.\n",
        "Wait, that is wrong. ",
        "So it is 6. I said So. Solution: 6",  # "said So" is mid-sentence; "Solution" is no word match
    ]
    spans = seg("keyword", list(text), min_tokens=1, keyword_anywhere=True)
    assert [text[s:e] for s, e in spans] == [
        "I think 5.\n",
        "Wait, that is wrong. ",
        "So it is 6. I said ",
        "So. Solution: 6",
    ]
    # Case-sensitive, configurable list.
    assert seg("keyword", list("ok.\nwait no"), min_tokens=1) == [(0, 11)]
    assert seg("keyword", list("ok.\nwait no"), min_tokens=1, keywords=["wait"]) == [(0, 4), (4, 11)]


def test_keyword_multichar_tokens():
    texts = ["5", ".", " Wait", ",", " no", ".", "\n\n", "Let", " me", " check"]
    assert seg("keyword", texts, min_tokens=1) == [(0, 2), (2, 7), (7, 10)]


# ---------------------------------------------------------------------------------- entropy


def test_entropy_splits_at_top_tokens():
    h = [0.1, 0.2, 0.1, 3.0, 0.1, 0.3, 0.2, 2.0, 0.1, 0.1]
    texts = ["a"] * 10
    # Top 20% of 10 tokens: tokens 3 and 7 start new segments.
    assert seg("entropy", texts, h, min_tokens=1, entropy_quantile=0.8) == [(0, 3), (3, 7), (7, 10)]
    # Top 10%: only the highest.
    assert seg("entropy", texts, h, min_tokens=1, entropy_quantile=0.9) == [(0, 3), (3, 10)]
    # Absolute threshold overrides the quantile.
    assert seg("entropy", texts, h, min_tokens=1, entropy_threshold=0.25) == [(0, 3), (3, 5), (5, 7), (7, 10)]
    # Too many: the highest-entropy boundaries are kept.
    assert seg("entropy", texts, h, min_tokens=1, entropy_threshold=0.25, max_segments=3) == [(0, 3), (3, 7), (7, 10)]
    # min_tokens: token 5 (0.3) would leave a 2-token segment after token 3, so it is skipped.
    assert seg("entropy", texts, h, min_tokens=3, entropy_threshold=0.25) == [(0, 3), (3, 7), (7, 10)]
    assert seg("entropy", [], [], min_tokens=1) == [(0, 0)]


# ---------------------------------------------------------------------------------- hybrid


def test_hybrid_ranks_keywords_by_entropy():
    text = "x=1.\nSo y=2.\nWait y=3.\nThen z=4."
    texts = list(text)
    h = [0.0] * len(texts)
    so, wait, then = text.index("So"), text.index("Wait"), text.index("Then")
    h[so], h[wait], h[then] = 1.0, 3.0, 2.0
    spans = seg("hybrid", texts, h, min_tokens=1, max_segments=40)
    assert [s for s, _ in spans] == [0, so, wait, then]
    # At most max_segments - 1 keyword boundaries, the highest-entropy ones.
    spans = seg("hybrid", texts, h, min_tokens=1, max_segments=3)
    assert [s for s, _ in spans] == [0, wait, then]


def test_hybrid_adds_entropy_cuts_in_long_keyword_free_span():
    text = "So a" + "b" * 30 + ".\nWait c."
    texts = list(text)
    h = [0.0] * len(texts)
    wait = text.index("Wait")
    h[wait] = 1.0
    h[12], h[20] = 5.0, 4.0  # forking tokens inside the long keyword-free span 0..wait
    spans = seg("hybrid", texts, h, min_tokens=1, hybrid_max_span=16)
    assert [s for s, _ in spans] == [0, 12, 20, wait]  # 0..12, 12..20, 20..wait all <= 16
    # Without the span limit mattering only the keyword cut remains.
    assert [s for s, _ in seg("hybrid", texts, h, min_tokens=1, hybrid_max_span=64)] == [0, wait]
    # max_segments caps the extra cuts too.
    assert [s for s, _ in seg("hybrid", texts, h, min_tokens=1, hybrid_max_span=16, max_segments=3)] == [0, 12, wait]


def test_missing_or_mismatched_entropies():
    for rule in ["entropy", "hybrid"]:
        with pytest.raises(ValueError, match=f"segment={rule} needs per-token entropies"):
            seg(rule, list("So it is."), None)
        with pytest.raises(ValueError, match="entropies for 9 tokens"):
            seg(rule, list("So it is."), [0.0] * 3)
    with pytest.raises(ValueError, match="entropy_quantile"):
        seg("entropy", ["a"], [0.0], entropy_quantile=1.5)
    with pytest.raises(ValueError, match="hybrid_max_span"):
        seg("hybrid", ["a"], [0.0], hybrid_max_span=0)


# ---------------------------------------------------------------------------------- registry


def test_fixed_by_hand():
    assert fixed(["a"] * 10, tokens=4, min_tokens=1, max_segments=40) == [(0, 4), (4, 8), (8, 10)]
    # A 1-token remainder is merged into its neighbour when min_tokens=2.
    assert fixed(["a"] * 9, tokens=4, min_tokens=2, max_segments=40) == [(0, 4), (4, 9)]
    assert fixed([], tokens=4, min_tokens=1, max_segments=40) == [(0, 0)]


def test_max_segments_merges_shortest():
    spans = enforce_limits([(0, 1), (1, 5), (5, 6), (6, 10)], min_tokens=0, max_segments=2)
    assert spans == [(0, 5), (5, 10)]


def test_registry():
    assert set(SEGMENTERS) == {"fixed", "newline", "keyword", "entropy", "hybrid"}
    assert SEGMENTERS["keyword"] is keyword and SEGMENTERS["entropy"] is entropy and SEGMENTERS["hybrid"] is hybrid
    assert get_segmenter("newline") is newline
    assert [name for name in sorted(SEGMENTERS) if needs_entropy(name)] == ["entropy", "hybrid"]
    with pytest.raises(KeyError, match="valid: entropy, fixed, hybrid, keyword, newline"):
        get_segmenter("sentence")
    with pytest.raises(KeyError):
        needs_entropy("sentence")


def test_config_defaults_match_rule_defaults():
    assert SegmentConfig().keywords == list(DEFAULT_KEYWORDS)
    # Every rule accepts every SegmentConfig field (the stage passes them all).
    for rule in SEGMENTERS:
        text = "So x.\nWait y."
        assert_tiles(seg(rule, list(text), [0.5] * len(text)), len(text))
