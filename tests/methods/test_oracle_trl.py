"""Oracle lane, advantages: GRPO, Dr. GRPO, RLOO and DAPO against TRL 1.16's own trainers.

TRL computes these advantages inline in ``GRPOTrainer._generate_and_score_completions`` and
``RLOOTrainer._generate_and_score_completions``; ``tests/trl_oracle.py`` runs those methods of a
real trainer on the test's fixed rewards. DAPO's length shaping is TRL's module-level
``trl.rewards.get_soft_overlong_punishment``. Random fixed rewards, several seeds, groups of
2/8/16 with binary, continuous and exactly-representable all-equal groups side by side; values
agree to float32 rounding (a few ulps: TRL's torch.nanmean and rredcot's index_add_ sum in
different orders). Both stds are Bessel-corrected (TRL's ``trl.trainer.utils.nanstd``).

Documented deviations from TRL, each pinned by hand and shown against TRL:
- eps: TRL divides by std + 1e-4, rredcot's grpo/dapo by std + 1e-6 (verl's) by default;
- a group of one: TRL gives advantage 0 (its eval-only ``num_generations=1`` path), rredcot's grpo
  and rloo give verl's r / (1 + eps) and r, dapo gives 0 by default (``zero_uniform_groups``);
- an all-equal group whose rewards are not exactly representable: rredcot gives exactly 0, TRL's
  float32 group mean leaves a small non-zero advantage (issue 30);
- dapo's ``zero_uniform_groups``: a group whose correctness is uniform gets 0 even when the length
  penalty differs within it; TRL's recipe normalises the shaped reward of such a group.

Skips without TRL (``pip install trl==1.16.0``; CI's vLLM lane has it).
"""

import pytest
import torch

pytest.importorskip("trl", minversion="1.16")

from trl_oracle import grpo_trainer, rloo_trainer, trl_advantages  # noqa: E402

from rredcot_cli.methods import get_method  # noqa: E402
from rredcot_cli.methods.base import CreditBatch  # noqa: E402
from rredcot_cli.methods.dapo import dapo_advantage, overlong_penalty  # noqa: E402
from rredcot_cli.methods.grpo import grpo_advantage  # noqa: E402
from rredcot_cli.methods.rloo import rloo_advantage  # noqa: E402

pytestmark = pytest.mark.oracle

TRL_EPS = 1e-4  # TRL's std + 1e-4 (grpo_trainer.py, scale_rewards != "none")
SEEDS = (0, 1, 2)
GROUP_SIZES = (2, 8, 16)
# float32 rounding: TRL's torch.nanmean and rredcot's index_add_ sum in different orders.
TOL = dict(rtol=1e-5, atol=1e-6)


def mixed_rewards(seed: int, k: int) -> torch.Tensor:
    """(5 k,) float32 rewards, five groups of k rows: binary, continuous in [-1, 3), all 1.0,
    all 0.5 (exact all-equal groups), and binary with one continuous entry."""
    gen = torch.Generator().manual_seed(seed)
    binary = torch.randint(0, 2, (k,), generator=gen).float()
    continuous = torch.rand(k, generator=gen) * 4 - 1
    mixed = torch.randint(0, 2, (k,), generator=gen).float()
    mixed[0] = torch.rand((), generator=gen)
    return torch.cat([binary, continuous, torch.ones(k), torch.full((k,), 0.5), mixed])


def groups_of(k: int, n: int) -> torch.Tensor:
    return torch.arange(n) // k


def batch_of(rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor | None = None) -> CreditBatch:
    """A CreditBatch with one segment per completion; ``lengths`` tokens each (default 3, one row empty)."""
    n = rewards.numel()
    if lengths is None:
        lengths = torch.full((n,), 3)
        lengths[-1] = 0
    width = max(int(lengths.max()), 1)
    segment_ids = torch.where(torch.arange(width)[None, :] < lengths[:, None], 0, -1)
    return CreditBatch(rewards=rewards, group_ids=group_ids, segment_ids=segment_ids,
                       num_segments=torch.ones(n, dtype=torch.long))


# ------------------------------------------------------------------------------------------
# Agreement
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", GROUP_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_advantage_equals_trls_group_scaling(seed, k):
    """GRPO with TRL's eps equals ``GRPOTrainer``'s scale_rewards="group" advantage."""
    rewards = mixed_rewards(seed, k)
    theirs = trl_advantages(grpo_trainer(), rewards, k, scale_rewards="group")
    ours = grpo_advantage(rewards, groups_of(k, rewards.numel()), scale_by_std=True, eps=TRL_EPS)
    torch.testing.assert_close(ours, theirs, **TOL)
    # the registered method broadcasts the same advantage to every token
    tokens = get_method("grpo").fn(batch_of(rewards, groups_of(k, rewards.numel())), scale_by_std=True,
                                   eps=TRL_EPS).token_advantages
    torch.testing.assert_close(tokens[:, 0][:-1], theirs[:-1], **TOL)


@pytest.mark.parametrize("k", GROUP_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_dr_grpo_advantage_equals_trls_unscaled_advantage(seed, k):
    """Dr. GRPO's r - mean equals ``GRPOTrainer``'s scale_rewards="none" advantage (no eps involved)."""
    rewards = mixed_rewards(seed, k)
    theirs = trl_advantages(grpo_trainer(), rewards, k, scale_rewards="none")
    batch = batch_of(rewards, groups_of(k, rewards.numel()))
    ours = get_method("dr_grpo").fn(batch).token_advantages[:, 0]
    torch.testing.assert_close(ours[:-1], theirs[:-1], **TOL)
    assert ours[-1] == 0  # the empty row has no tokens to carry it


@pytest.mark.parametrize("k", GROUP_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_advantage_equals_trls_leave_one_out(seed, k):
    """RLOO equals ``RLOOTrainer``'s leave-one-out advantage (beta 0, normalize_advantages off)."""
    rewards = mixed_rewards(seed, k)
    theirs = trl_advantages(rloo_trainer(), rewards, k)
    ours = rloo_advantage(rewards, groups_of(k, rewards.numel()))
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize(("max_length", "cache_length"), [(16, 4), (16, 16), (16, 0), (5, 3)])
def test_overlong_penalty_equals_trls_soft_overlong_punishment(max_length, cache_length):
    """``overlong_penalty`` equals ``trl.rewards.get_soft_overlong_punishment`` exactly, for every
    length from 0 to past the budget."""
    from trl.rewards import get_soft_overlong_punishment

    lengths = torch.arange(0, max_length + 4)
    punish = get_soft_overlong_punishment(max_completion_len=max_length, soft_punish_cache=cache_length)
    theirs = torch.tensor(punish(completion_ids=[[7] * int(n) for n in lengths]), dtype=torch.float32)
    assert torch.equal(overlong_penalty(lengths, max_length, cache_length), theirs)


@pytest.mark.parametrize("k", GROUP_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_dapo_advantage_equals_trls_dapo_recipe(seed, k):
    """DAPO (``zero_uniform_groups=false``, TRL's eps) equals TRL's recipe: the correctness reward
    2r - 1 plus ``get_soft_overlong_punishment`` summed (one reward column here), normalised by
    ``GRPOTrainer`` with scale_rewards="group"."""
    from trl.rewards import get_soft_overlong_punishment

    max_length, cache_length = 12, 4
    rewards = mixed_rewards(seed, k).clamp(0, 1)
    gen = torch.Generator().manual_seed(100 + seed)
    lengths = torch.randint(0, max_length + 3, rewards.shape, generator=gen)
    punish = get_soft_overlong_punishment(max_completion_len=max_length, soft_punish_cache=cache_length)
    shaped = (2 * rewards - 1) + torch.tensor(punish(completion_ids=[[7] * int(n) for n in lengths]))
    theirs = trl_advantages(grpo_trainer(), shaped, k, scale_rewards="group")
    ours = dapo_advantage(rewards, groups_of(k, rewards.numel()), lengths, signed_reward=True,
                          overlong_shaping=True, max_length=max_length, cache_length=cache_length,
                          overlong_filter=False, zero_uniform_groups=False, eps=TRL_EPS)
    torch.testing.assert_close(ours, theirs, **TOL)


# ------------------------------------------------------------------------------------------
# Documented deviations: pinned by hand, and shown to differ from TRL
# ------------------------------------------------------------------------------------------


def test_grpo_default_eps_is_verls_not_trls():
    """Default eps 1e-6 (verl): rewards [0, 1] give +-1 / (std + 1e-6) with std = 1/sqrt(2);
    TRL's 1e-4 gives +-1 / (std + 1e-4). Equal at eps=1e-4 (the agreement tests above)."""
    rewards = torch.tensor([0.0, 1.0])
    std = 2 ** -0.5
    ours = grpo_advantage(rewards, torch.zeros(2, dtype=torch.long), scale_by_std=True, eps=1e-6)
    torch.testing.assert_close(ours, torch.tensor([-0.5 / (std + 1e-6), 0.5 / (std + 1e-6)]))
    theirs = trl_advantages(grpo_trainer(), rewards, 2, scale_rewards="group")
    torch.testing.assert_close(theirs, torch.tensor([-0.5 / (std + 1e-4), 0.5 / (std + 1e-4)]))
    assert not torch.allclose(ours, theirs, rtol=1e-5, atol=0)


def test_group_of_one_gets_verls_advantage_where_trl_gives_zero():
    """A group of one completion: grpo r / (1 + eps), rloo r (verl's convention; docstrings),
    dapo 0 by default and R / (1 + eps) with zero_uniform_groups=false. TRL's num_generations=1
    path (reachable in its eval) gives 0 for GRPO and RLOO."""
    rewards = torch.tensor([1.0, 0.0, 0.25])
    singles = torch.arange(3)
    torch.testing.assert_close(grpo_advantage(rewards, singles, scale_by_std=True, eps=1e-6), rewards / (1 + 1e-6))
    torch.testing.assert_close(rloo_advantage(rewards, singles), rewards)
    lengths = torch.full((3,), 2)
    dapo = dict(signed_reward=True, overlong_shaping=True, max_length=12, cache_length=4, overlong_filter=False,
                eps=1e-6)
    assert torch.equal(dapo_advantage(rewards, singles, lengths, zero_uniform_groups=True, **dapo), torch.zeros(3))
    torch.testing.assert_close(dapo_advantage(rewards, singles, lengths, zero_uniform_groups=False, **dapo),
                               (2 * rewards - 1) / (1 + 1e-6))
    assert torch.equal(trl_advantages(grpo_trainer(), rewards, 1, scale_rewards="group"), torch.zeros(3))
    assert torch.equal(trl_advantages(rloo_trainer(), rewards, 1), torch.zeros(3))


# Sixteen float32 copies of 7.7 have a float32 mean a few ulps off 7.7, both in rredcot's old
# index_add_ order and in TRL's torch.nanmean order (the 0.9536147117614746 is exact in the
# latter, and TRL's GRPO gives it 0).
INEXACT = 7.7


def test_all_equal_inexact_group_is_exactly_zero_where_trl_leaves_a_residue():
    """Sixteen equal rewards 7.7: grpo, dr_grpo and rloo give exactly 0 (base.group_mean_std);
    TRL's float32 statistics leave a residue in each: about 5e-3 for GRPO (ulps over std + 1e-4:
    its eps of 1e-4 keeps it far below the O(1) that eps 1e-6 gave here before the fix), a few
    ulps for scale_rewards="none" and RLOO."""
    k = 16
    rewards = torch.full((k,), INEXACT)
    groups = torch.zeros(k, dtype=torch.long)
    assert torch.equal(grpo_advantage(rewards, groups, scale_by_std=True, eps=TRL_EPS), torch.zeros(k))
    assert torch.equal(grpo_advantage(rewards, groups, scale_by_std=False, eps=0.0), torch.zeros(k))
    assert torch.equal(rloo_advantage(rewards, groups), torch.zeros(k))
    grpo = trl_advantages(grpo_trainer(), rewards, k, scale_rewards="group")
    unscaled = trl_advantages(grpo_trainer(), rewards, k, scale_rewards="none")
    rloo = trl_advantages(rloo_trainer(), rewards, k)
    assert 1e-3 < float(grpo.abs().max()) < 1e-2, grpo.tolist()
    assert 0 < float(unscaled.abs().max()) < 1e-5, unscaled.tolist()
    assert 0 < float(rloo.abs().max()) < 1e-5, rloo.tolist()


def test_dapo_uniform_correctness_group_is_zeroed_where_trl_normalises_the_length_penalty():
    """Two completions, both correct, lengths 8 and 12 (L_max 12, L_cache 4): shaped rewards
    1 + 0 and 1 - 1. rredcot's default zeroes the group (dynamic sampling would drop it); TRL's
    recipe gives +-0.5 / (std + 1e-4) with std = sqrt(0.5); zero_uniform_groups=false agrees."""
    from trl.rewards import get_soft_overlong_punishment

    rewards, groups, lengths = torch.tensor([1.0, 1.0]), torch.zeros(2, dtype=torch.long), torch.tensor([8, 12])
    dapo = dict(signed_reward=True, overlong_shaping=True, max_length=12, cache_length=4, overlong_filter=False,
                eps=TRL_EPS)
    assert torch.equal(dapo_advantage(rewards, groups, lengths, zero_uniform_groups=True, **dapo), torch.zeros(2))
    punish = get_soft_overlong_punishment(max_completion_len=12, soft_punish_cache=4)
    shaped = torch.tensor([1.0, 1.0]) + torch.tensor(punish(completion_ids=[[7] * 8, [7] * 12]))
    assert shaped.tolist() == [1.0, 0.0]
    theirs = trl_advantages(grpo_trainer(), shaped, 2, scale_rewards="group")
    expected = torch.tensor([0.5, -0.5]) / (0.5 ** 0.5 + TRL_EPS)
    torch.testing.assert_close(theirs, expected)
    torch.testing.assert_close(dapo_advantage(rewards, groups, lengths, zero_uniform_groups=False, **dapo), expected)
