"""Minibatching options of the update (train/batching.py; the "cancellation hypothesis" fixes of
arXiv 2605.08666, issue 30): hand-checked minibatches, the default path unchanged, and every row
used exactly once in every case."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot_cli.train.batching import advantage_signs, minibatch_rows


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_default_is_the_shuffled_rows_cut_in_order():
    """Same permutation and cuts as before the options existed: same seed, same minibatches."""
    order = torch.randperm(10, generator=_gen(3)).tolist()
    assert minibatch_rows(10, 4, _gen(3)) == [order[0:4], order[4:8], order[8:10]]


def test_query_preserved_keeps_whole_groups():
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    got = minibatch_rows(8, 4, _gen(0), group_ids=groups, query_preserved=True)
    assert len(got) == 2 and all(len(m) == 4 for m in got)
    for m in got:  # two whole groups each
        ids = groups[m].tolist()
        assert all(ids.count(g) == 2 for g in set(ids)) and len(set(ids)) == 2
    assert sorted(sum(got, [])) == list(range(8))


def test_query_preserved_never_splits_a_group_that_does_not_fit():
    """Groups of 3 into minibatches of 4: one group each (a 4th row would split the next one)."""
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    got = minibatch_rows(9, 4, _gen(1), group_ids=groups, query_preserved=True)
    assert sorted(sorted(groups[m].tolist()) for m in got) == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]


def test_reward_balanced_gives_every_minibatch_the_batch_mix():
    # 4 positive, 4 negative rows -> minibatches of 4 get 2 + 2.
    signs = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    got = minibatch_rows(8, 4, _gen(0), row_signs=signs, reward_balanced=True)
    assert len(got) == 2
    for m in got:
        assert (signs[m] > 0).sum() == 2 and (signs[m] < 0).sum() == 2
    # 6 positive, 2 negative, 4 neutral in 3 minibatches of 4: 2 / 0-1 / 1-2 each, all rows once.
    signs = torch.tensor([1.0] * 6 + [-1.0] * 2 + [0.0] * 4)
    got = minibatch_rows(12, 4, _gen(0), row_signs=signs, reward_balanced=True)
    assert [int((signs[m] > 0).sum()) for m in got] == [2, 2, 2]
    assert sorted(int((signs[m] < 0).sum()) for m in got) == [0, 1, 1]
    assert sorted(sum(got, [])) == list(range(12)) and all(len(m) == 4 for m in got)


def test_both_pair_the_most_and_least_positive_groups():
    """Groups with positive shares 1, 0.75, 0.25, 0 (of 4 rows): the alternate order puts the
    all-positive group with the all-negative one, and the 0.75 group with the 0.25 one."""
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    signs = torch.tensor([1.0] * 4 + [1.0, 1.0, 1.0, -1.0] + [1.0, -1.0, -1.0, -1.0] + [-1.0] * 4)
    got = minibatch_rows(16, 8, _gen(5), group_ids=groups, row_signs=signs, query_preserved=True,
                         reward_balanced=True)
    assert sorted(sorted(set(groups[m].tolist())) for m in got) == [[0, 3], [1, 2]]
    assert all(int((signs[m] > 0).sum()) == 4 for m in got)


def test_advantage_signs():
    adv = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert advantage_signs(adv).tolist() == [1.0, -1.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=8), st.integers(1, 9), st.integers(0, 10**6),
       st.booleans(), st.booleans())
def test_every_row_exactly_once(group_sizes, minibatch_size, seed, query_preserved, reward_balanced):
    groups = torch.tensor([g for g, n in enumerate(group_sizes) for _ in range(n)])
    B = groups.numel()
    signs = torch.sign(torch.randn(B, generator=_gen(seed))).round()
    got = minibatch_rows(B, minibatch_size, _gen(seed), group_ids=groups, row_signs=signs,
                         query_preserved=query_preserved, reward_balanced=reward_balanced)
    assert sorted(sum(got, [])) == list(range(B))
    assert all(m for m in got)
    if query_preserved:
        for m in got:
            for g in set(groups[m].tolist()):
                assert int((groups[m] == g).sum()) == int((groups == g).sum())
