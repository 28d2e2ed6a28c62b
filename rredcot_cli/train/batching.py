"""How one pass of an update cuts the batch into minibatches.

Default: a random permutation of the rows cut into consecutive runs of ``minibatch_size``
(PPO/GRPO's shuffled minibatches). Two options from "The Cancellation Hypothesis in Critic-Free
RL: From Outcome Rewards to Token Credits" (Cheng, Huang, Qiu, et al., 2026, arXiv 2605.08666),
whose argument is that outcome-only RL assigns token credit implicitly: the opposite-signed
gradients of a prompt's correct and wrong rollouts cancel on the tokens they share, so the tokens
specific to the correct ones are what is reinforced. Both options keep that cancellation inside
each optimizer step:

query_preserved  every minibatch holds whole prompt groups (the paper's "query-preserved
                 mini-batching: keeps rollouts from the same prompt together"): the groups are
                 shuffled and packed in order, a group going to the next minibatch when it would
                 overflow this one (a group larger than ``minibatch_size`` is a minibatch alone).
                 With ``minibatch_size`` a multiple of the group size (32 and 8 by default) every
                 minibatch is full.
reward_balanced  every minibatch holds the batch's positive and negative rollouts in the same
                 proportion (the paper's "reward-balanced batching: positive and negative rollouts
                 are balanced in each update"). A row is positive, negative or neutral by the sign
                 of its summed token advantage; without query_preserved each stratum is shuffled
                 and dealt round-robin into the minibatches; with it, the shuffled groups are
                 ordered by their share of positive rows and taken alternately from the most and
                 the least positive end, so that groups whose imbalances cancel share a minibatch.

INFERRED: only the paper's abstract (and its one-line descriptions of the two options) could be
read here; the packing rules above, the stratification by the advantage's sign (not the reward)
and keeping every row (no down-sampling to an exact 50/50 split, which would change the number of
rows trained on) are this implementation's choices. The default path draws the same permutation
from ``generator`` as before the options existed (same seed, same minibatches).
"""

from __future__ import annotations

import torch


def minibatch_rows(batch_size: int, minibatch_size: int, generator: torch.Generator, *,
                   group_ids: torch.Tensor | None = None, row_signs: torch.Tensor | None = None,
                   query_preserved: bool = False, reward_balanced: bool = False) -> list[list[int]]:
    """The minibatches (lists of row indices) of one pass over ``batch_size`` rows.

    group_ids: (B,) int64 prompt group of each row (needed by ``query_preserved``); row_signs:
    (B,) sign of each row's advantage, -1/0/+1 (needed by ``reward_balanced``). Every row appears
    exactly once. Each call consumes ``generator`` (one permutation of the rows first, so the
    default path is unchanged)."""
    order = torch.randperm(batch_size, generator=generator).tolist()
    if not (query_preserved or reward_balanced):
        return [order[k : k + minibatch_size] for k in range(0, batch_size, minibatch_size)]
    if query_preserved and group_ids is None:
        raise ValueError("query_preserved minibatches need the batch's group ids")
    if reward_balanced and row_signs is None:
        raise ValueError("reward_balanced minibatches need the sign of each row's advantage")
    if query_preserved:
        groups = _groups_in_order(order, group_ids.tolist())
        if reward_balanced:
            groups = _alternate_by_positive_share(groups, row_signs.tolist())
        return _pack_groups(groups, minibatch_size)
    return _stratified(order, row_signs.tolist(), minibatch_size)


def _groups_in_order(order: list[int], group_ids: list[int]) -> list[list[int]]:
    """The groups in the order their first row appears in ``order``, rows in that order too."""
    groups: dict[int, list[int]] = {}
    for i in order:
        groups.setdefault(group_ids[i], []).append(i)
    return list(groups.values())


def _alternate_by_positive_share(groups: list[list[int]], signs: list[float]) -> list[list[int]]:
    """Groups sorted (stably) by their share of positive rows, then taken alternately from the most
    and the least positive end."""
    ranked = sorted(groups, key=lambda g: sum(signs[i] > 0 for i in g) / len(g))
    out = []
    lo, hi = 0, len(ranked) - 1
    while lo <= hi:
        out.append(ranked[hi])
        hi -= 1
        if lo <= hi:
            out.append(ranked[lo])
            lo += 1
    return out


def _pack_groups(groups: list[list[int]], minibatch_size: int) -> list[list[int]]:
    """Whole groups into minibatches of at most ``minibatch_size`` rows, in order."""
    out: list[list[int]] = []
    for g in groups:
        if out and len(out[-1]) + len(g) <= minibatch_size:
            out[-1].extend(g)
        else:
            out.append(list(g))
    return out


def _stratified(order: list[int], signs: list[float], minibatch_size: int) -> list[list[int]]:
    """Rows dealt round-robin into ceil(B / minibatch_size) minibatches, positives first, then
    negatives, then neutral rows, each stratum in ``order``; every minibatch gets the batch's mix
    up to one row per stratum."""
    count = -(-len(order) // minibatch_size)
    strata = [[i for i in order if signs[i] > 0], [i for i in order if signs[i] < 0],
              [i for i in order if signs[i] == 0]]
    out: list[list[int]] = [[] for _ in range(count)]
    slot = 0
    for stratum in strata:
        for i in stratum:
            out[slot % count].append(i)
            slot += 1
    return [m for m in out if m]


def advantage_signs(advantages: torch.Tensor) -> torch.Tensor:
    """(B, T) token advantages -> (B,) sign of each row's summed advantage (-1, 0, +1)."""
    return torch.sign(advantages.sum(-1))
