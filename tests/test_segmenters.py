"""Segmenters tile the completion exactly, for every rule, on arbitrary token texts."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot_cli.segmenters import SEGMENTERS, enforce_limits, fixed, newline

token_texts = st.lists(st.sampled_from(["a", "1", "+", "=", " ", "\n", "x\n", ".", "Wait"]), max_size=300)


def assert_tiles(spans, n):
    assert spans[0][0] == 0
    assert spans[-1][1] == n
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert e0 == s1
    if n:
        assert all(e > s for s, e in spans)


@settings(max_examples=300, deadline=None)
@given(texts=token_texts, rule=st.sampled_from(sorted(SEGMENTERS)), tokens=st.integers(1, 50),
       min_tokens=st.integers(0, 20), max_segments=st.integers(1, 60))
def test_every_rule_tiles(texts, rule, tokens, min_tokens, max_segments):
    spans = SEGMENTERS[rule](texts, tokens=tokens, min_tokens=min_tokens, max_segments=max_segments)
    assert_tiles(spans, len(texts))
    assert len(spans) <= max_segments
    if len(spans) > 1:
        assert all(e - s >= min_tokens for s, e in spans)


def test_newline_by_hand():
    texts = list("1+2=3\n3+4=7\nAnswer: 7") + ["<eos>"]
    spans = newline(texts, tokens=0, min_tokens=1, max_segments=40)
    assert spans == [(0, 6), (6, 12), (12, len(texts))]


def test_fixed_by_hand():
    assert fixed(["a"] * 10, tokens=4, min_tokens=1, max_segments=40) == [(0, 4), (4, 8), (8, 10)]
    # A 1-token remainder is merged into its neighbour when min_tokens=2.
    assert fixed(["a"] * 9, tokens=4, min_tokens=2, max_segments=40) == [(0, 4), (4, 9)]
    assert fixed([], tokens=4, min_tokens=1, max_segments=40) == [(0, 0)]


def test_max_segments_merges_shortest():
    spans = enforce_limits([(0, 1), (1, 5), (5, 6), (6, 10)], min_tokens=0, max_segments=2)
    assert spans == [(0, 5), (5, 10)]
