"""Group statistics are exact for all-equal groups (issue 30 item 1).

Sixteen rewards all 0.9536147117614746 (float32) used to give every row A = -0.191 under GRPO: the
float32 group mean is a few ulps off the common value and the std is of the same size, so the
quotient is O(1). Every method that centres or normalises rewards within a group must give such
a group exactly 0 (and the reweighting rivals must skip it, as they skip exactly-equal binary
groups), while binary, dyadic and any other non-uniform groups keep bit-identical advantages.
"""

import pytest
import torch

from rredcot_cli.methods import get_method
from rredcot_cli.methods._attribution import _group_standardise, attribution_advantages
from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.methods.delta_belief import turnwise_grpo
from rredcot_cli.methods.dapo import dapo_advantage
from rredcot_cli.methods.grpo import grpo_advantage
from rredcot_cli.methods.rloo import rloo_advantage
from rredcot_cli.methods.rredcot import _group_stats, redistribute

# The issue's example, then values up to 10 whose float32 group-of-16 mean is inexact (found by
# scanning k/1000 for k <= 10000: 69% of them are).
ALL_EQUAL = [0.9536147117614746, 0.1, 0.7, 1.1, 3.3, 7.7, 9.7]
N = 16


def old_group_mean_std(rewards, group_ids):
    """The formula before the fix (float32 sums, unbiased std; groups of one: mean 0, std 1)."""
    rewards = rewards.to(torch.float32)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape[0]).index_add_(0, inverse, rewards)
    means = sums / counts
    sq_dev = torch.zeros(counts.shape[0]).index_add_(0, inverse, (rewards - means[inverse]) ** 2)
    stds = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    single = counts == 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    return means[inverse], stds[inverse]


def old_grpo_advantage(rewards, group_ids, scale_by_std, eps):
    mean, std = old_group_mean_std(rewards, group_ids)
    advantage = rewards.to(torch.float32) - mean
    return advantage / (std + eps) if scale_by_std else advantage


def old_rloo_advantage(rewards, group_ids):
    rewards = rewards.to(torch.float32)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape[0]).index_add_(0, inverse, rewards)
    k = counts[inverse].to(torch.float32)
    others_mean = (sums[inverse] - rewards) / (k - 1).clamp(min=1)
    return torch.where(k > 1, rewards - others_mean, rewards)


class Untouchable:
    """A tokenizer/model stand-in: any use means a group with advantage 0 was scored."""

    def __getattr__(self, name):
        raise AssertionError(f"a uniform group was scored (touched .{name})")

    def __call__(self, *args, **kwargs):
        raise AssertionError("a uniform group was scored (called the tokenizer)")


def uniform_batch(value: float, n: int = N, length: int = 3) -> CreditBatch:
    """n completions of one prompt, all with reward ``value``, ``length`` tokens in 1 segment."""
    return CreditBatch(
        rewards=torch.full((n,), value, dtype=torch.float32),
        group_ids=torch.zeros(n, dtype=torch.long),
        segment_ids=torch.zeros(n, length, dtype=torch.long),
        num_segments=torch.ones(n, dtype=torch.long),
        prompt_token_ids=[[1, 2, 3]] * n,
        completion_token_ids=[[4 + (i % 3), 5, 6] for i in range(n)],
        extras={"gold_answers": ["1"] * n, "pred_answers": ["1"] * n},
    )


def method_tokens(name: str, batch: CreditBatch) -> torch.Tensor:
    """(B, T) token advantages of ``name`` with its default parameters (outcome term only for the
    attribution methods, whose probes need a model)."""
    if name in ("gradient", "loo"):  # both turn attributions into advantages with this map
        attributions = torch.linspace(-1, 1, batch.rewards.numel())[:, None]
        return attribution_advantages(attributions, batch, beta=1.0, w_min=0.1, w_max=3.0, eps=1e-6).token_advantages
    if name == "rredcot":  # the outcome term of the mixed rule
        values = torch.stack([torch.zeros_like(batch.rewards), batch.rewards], 1)
        return redistribute(values, batch, advantage="mixed", mix_lambda=0.0, clip_reward=0.0,
                            eps=1e-6).token_advantages
    params = dict(get_method(name).params().__dict__)
    if name == "dapo":  # the default masks uniform correctness groups anyway; test the statistic
        params["zero_uniform_groups"] = False
    extra = {"policy": type("P", (), {"tokenizer": Untouchable(), "model": Untouchable()})()} \
        if name in ("cort", "sc_grpo", "cscr") else {}
    return get_method(name).fn(batch, **params, **extra).token_advantages


AFFECTED = ["grpo", "dr_grpo", "rloo", "dapo", "cort", "sc_grpo", "cscr", "ktae", "gradient", "loo", "rredcot"]


@pytest.mark.parametrize("value", ALL_EQUAL)
@pytest.mark.parametrize("name", AFFECTED)
def test_all_equal_group_gets_exactly_zero_advantage(name, value):
    batch = uniform_batch(value)
    tokens = method_tokens(name, batch)
    if name == "ktae":
        # ktae adds key-token values to the outcome advantage; with every completion correct the
        # result must equal that of an exactly-representable all-correct group (outcome term 0).
        assert torch.equal(tokens, method_tokens(name, uniform_batch(1.0)))
    else:
        assert torch.equal(tokens, torch.zeros_like(tokens)), tokens[0].tolist()


@pytest.mark.parametrize("value", ALL_EQUAL)
def test_all_equal_group_beside_an_informative_one(value):
    """The fix is per group: a uniform group next to a non-uniform one gets 0, the other keeps
    the old advantages bit for bit."""
    rewards = torch.tensor([value] * N + [value, 0.0, 1.0, 0.5], dtype=torch.float32)
    groups = torch.tensor([0] * N + [1] * 4)
    for scale in (True, False):
        new = grpo_advantage(rewards, groups, scale, 1e-6)
        assert torch.equal(new[:N], torch.zeros(N))
        assert torch.equal(new[N:], old_grpo_advantage(rewards, groups, scale, 1e-6)[N:])
    new = rloo_advantage(rewards, groups)
    assert torch.equal(new[:N], torch.zeros(N)) and torch.equal(new[N:], old_rloo_advantage(rewards, groups)[N:])


def test_issue_example_was_a_large_advantage():
    """What the defect looked like, so the example above is known to exercise it."""
    rewards, groups = torch.full((N,), 0.9536147117614746), torch.zeros(N, dtype=torch.long)
    assert old_grpo_advantage(rewards, groups, True, 1e-6)[0].item() == pytest.approx(-0.191, abs=1e-3)


@pytest.mark.parametrize("seed", range(20))
def test_binary_dyadic_and_other_non_uniform_groups_are_bit_identical(seed):
    """Random batches of groups of 1-16 with binary, dyadic (k/8) or continuous rewards: the new
    statistics equal the old formula exactly (uniform groups of exactly representable values
    gave 0 before and still do; a group of one keeps mean 0 and std 1)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 17, (6,), generator=gen).tolist()
    groups = torch.cat([torch.full((s,), g) for g, s in enumerate(sizes)])
    B = groups.numel()
    kinds = {
        "binary": torch.randint(0, 2, (B,), generator=gen).float(),
        "dyadic": torch.randint(0, 9, (B,), generator=gen).float() / 8,
        "continuous": torch.rand(B, generator=gen) * 10,
    }
    for kind, rewards in kinds.items():
        for scale, eps in ((True, 1e-6), (False, 0.0)):
            assert torch.equal(grpo_advantage(rewards, groups, scale, eps),
                               old_grpo_advantage(rewards, groups, scale, eps)), (kind, scale)
        assert torch.equal(rloo_advantage(rewards, groups), old_rloo_advantage(rewards, groups)), kind
        if kind != "continuous":
            lengths = torch.randint(1, 40, (B,), generator=gen)
            knobs = dict(signed_reward=True, overlong_shaping=True, max_length=32, cache_length=8,
                         overlong_filter=False, zero_uniform_groups=True, eps=1e-6)
            shaped = 2 * rewards - 1  # what dapo normalises, before the length penalty
            assert torch.equal(dapo_advantage(rewards, groups, lengths, **{**knobs, "overlong_shaping": False}),
                               torch.where(_uniform(rewards, groups), torch.zeros(B),
                                           old_grpo_advantage(shaped, groups, True, 1e-6))), kind


def _uniform(rewards, groups):
    return torch.stack([(rewards[groups == g].max() == rewards[groups == g].min()) for g in groups])


@pytest.mark.parametrize("value", ALL_EQUAL)
def test_segment_pools_of_equal_values_standardise_to_zero(value):
    """The within-group statistics of segment quantities (rredcot's segment rewards, the
    attribution z-scores, delta_belief's per-index pools) are exact for all-equal pools too."""
    groups = torch.zeros(N, dtype=torch.long)
    x = torch.full((N, 2), value)
    x[:, 1] = float("nan")
    assert torch.equal(_group_standardise(x, groups, 1e-6)[:, 0], torch.zeros(N))
    mean, std = _group_stats(x, groups, 1e-6)
    assert torch.equal(mean, torch.full((N,), value)) and torch.equal(std, torch.full((N,), 1e-6))
    r = torch.full((N, 1), value, dtype=torch.float64) / 3  # a float64 value, inexact in a sum of 16
    out = turnwise_grpo(r, groups, torch.ones(N, dtype=torch.long), missing_segments="zero", scale_by_std=True,
                        eps=1e-6)
    assert torch.equal(out, torch.zeros_like(out))
