"""RLOO and DAPO advantages on hand-computed tensors, their presets, and one short training run."""

import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from rredcot_cli.config.compose import compose
from rredcot_cli.methods import get_method
from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.methods.dapo import DAPOParams, dapo_advantage, overlong_penalty

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_batch(rewards, groups, lengths, segments_per_completion=None):
    segments_per_completion = segments_per_completion or [1] * len(rewards)
    T = max(lengths)
    seg = torch.full((len(rewards), T), -1, dtype=torch.long)
    for i, (n, k) in enumerate(zip(lengths, segments_per_completion)):
        for t in range(n):
            seg[i, t] = min(k - 1, t * k // n)
    return CreditBatch(rewards=torch.tensor(rewards, dtype=torch.float32), group_ids=torch.tensor(groups),
                       segment_ids=seg, num_segments=torch.tensor(segments_per_completion))


def assert_rows(adv, expected, lengths):
    for i, n in enumerate(lengths):
        assert torch.allclose(adv[i, :n], torch.full((n,), float(expected[i])), atol=1e-5), i
        assert torch.all(adv[i, n:] == 0), f"padding of row {i} is not exactly 0"


# ------------------------------------------------------------------------------------------
# RLOO
# ------------------------------------------------------------------------------------------


def test_rloo_hand_computed():
    # Group 0: 1,0,0,1 -> r_i minus the mean of the other three: 1 - 1/3, 0 - 2/3.
    # Group 1: 1,0 -> +-1. Group 2 has one completion: no baseline, raw reward.
    rewards, lengths = [1, 0, 0, 1, 1, 0, 0.7], [3, 2, 4, 1, 2, 3, 2]
    batch = make_batch(rewards, [0, 0, 0, 0, 1, 1, 2], lengths, [2, 1, 2, 1, 1, 3, 1])
    credit = get_method("rloo").fn(batch)
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.0, -1.0, 0.7]
    assert credit.token_advantages.shape == (7, 4)
    assert_rows(credit.token_advantages, expected, lengths)
    # k/(k-1) * (r - mean): the other way of writing the same baseline.
    assert expected[0] == pytest.approx(4 / 3 * (1 - 0.5))
    assert credit.segment_credits[5, 2].item() == pytest.approx(-1.0)
    assert torch.isnan(credit.segment_credits[1, 1]) and torch.isnan(credit.segment_values).all()


def test_rloo_uniform_group_is_zero():
    batch = make_batch([1, 1, 1], [0, 0, 0], [2, 3, 1])
    assert torch.all(get_method("rloo").fn(batch).token_advantages == 0)


# ------------------------------------------------------------------------------------------
# DAPO
# ------------------------------------------------------------------------------------------


def test_overlong_penalty_hand_computed():
    # L_max 10, L_cache 4: free up to 6 tokens, then -1/4 per token, -1 past 10.
    lengths = torch.tensor([5, 6, 7, 8, 10, 11])
    assert torch.allclose(overlong_penalty(lengths, 10, 4), torch.tensor([0, 0, -0.25, -0.5, -1, -1.0]))
    # No soft zone: only the hard penalty beyond L_max.
    assert torch.allclose(overlong_penalty(lengths, 8, 0), torch.tensor([0, 0, 0, 0, -1, -1.0]))
    with pytest.raises(ValueError, match="cache_length <= max_length"):
        overlong_penalty(lengths, 4, 8)


DAPO_KW = dict(signed_reward=True, overlong_shaping=True, max_length=10, cache_length=4, overlong_filter=False,
               zero_uniform_groups=True, eps=0.0)


def test_dapo_hand_computed():
    # Group 0: correct, correct, wrong, wrong with lengths 5, 8, 6, 10 ->
    #   R = (+1 + 0, +1 - 0.5, -1 + 0, -1 - 1) = (1, 0.5, -1, -2), mean -0.375,
    #   unbiased std sqrt(5.6875 / 3).
    # Group 1: both correct (lengths 5, 9): uniform correctness -> advantage 0 despite the penalty.
    rewards, groups, lengths = [1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1], [5, 8, 6, 10, 5, 9]
    batch = make_batch(rewards, groups, lengths)
    credit = get_method("dapo").fn(batch, **DAPO_KW)
    std = math.sqrt(5.6875 / 3)
    expected = [1.375 / std, 0.875 / std, -0.625 / std, -1.625 / std, 0.0, 0.0]
    assert_rows(credit.token_advantages, expected, lengths)

    # Without the dynamic-sampling stand-in group 1 keeps its length signal: R = (1, 0.25).
    kept = dapo_advantage(batch.rewards, batch.group_ids, torch.tensor(lengths),
                          **{**DAPO_KW, "zero_uniform_groups": False})
    assert kept[4].item() == pytest.approx(0.375 / math.sqrt(2 * 0.375**2))
    assert kept[5].item() == pytest.approx(-kept[4].item())

    # Overlong filtering zeroes the completion that hit L_max (row 3) and nothing else.
    filtered = dapo_advantage(batch.rewards, batch.group_ids, torch.tensor(lengths),
                              **{**DAPO_KW, "overlong_filter": True})
    assert filtered[3] == 0 and torch.allclose(filtered[:3], torch.tensor(expected[:3]), atol=1e-5)


def test_dapo_unsigned_reward_changes_the_penalty_scale():
    # 0/1 reward: R = (1, 1 - 0.5, 0, 0 - 1) = (1, 0.5, 0, -1); mean 0.125.
    lengths = [5, 8, 6, 10]
    batch = make_batch([1, 1, 0, 0], [0, 0, 0, 0], lengths)
    adv = dapo_advantage(batch.rewards, batch.group_ids, torch.tensor(lengths),
                         **{**DAPO_KW, "signed_reward": False})
    R = torch.tensor([1, 0.5, 0, -1.0])
    assert torch.allclose(adv, (R - R.mean()) / R.std(), atol=1e-6)
    # Without shaping the +-1 map is an affine change GRPO's normalisation removes.
    plain = dapo_advantage(batch.rewards, batch.group_ids, torch.tensor(lengths),
                           **{**DAPO_KW, "overlong_shaping": False})
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=0.0).token_advantages[:, 0]
    assert torch.allclose(plain, grpo, atol=1e-6)


def test_dapo_group_of_one_is_zero_here_and_verls_value_without_uniform_zeroing():
    """Documented deviation (dapo.py): a group of one completion (sampling.n=1) is uniform, so
    the default zeroes it; verl gives a group of one mean 0 and std 1, A = R / (1 + eps)."""
    # Lengths 5 (free) and 7 (1 token into the L_cache=4 zone of L_max=10: R_len = -1/4).
    lengths = [5, 7, 5]
    batch = make_batch([1, 1, 0], [0, 1, 2], lengths)
    credit = get_method("dapo").fn(batch, **DAPO_KW)
    assert_rows(credit.token_advantages, [0.0, 0.0, 0.0], lengths)
    verl = dapo_advantage(batch.rewards, batch.group_ids, torch.tensor(lengths),
                          **{**DAPO_KW, "zero_uniform_groups": False, "eps": 1e-6})
    eps = 1e-6  # verl's epsilon
    expected = torch.tensor([1 / (1 + eps), 0.75 / (1 + eps), -1 / (1 + eps)])
    assert torch.allclose(verl, expected, rtol=0, atol=1e-7)
    assert verl[0].item() == pytest.approx(1.0, abs=2e-6)  # verl's 1.0 (up to eps)


# ------------------------------------------------------------------------------------------
# Presets and a short training run
# ------------------------------------------------------------------------------------------


def test_presets_compose():
    assert compose(["method=rloo"]).method == {"name": "rloo"}
    cfg = compose(["method=dapo"])
    assert dict(cfg.method) == {"name": "dapo", **DAPOParams().__dict__}
    exp = compose(["experiment=dapo"])
    assert exp.method.name == "dapo"
    assert (exp.train.clip_low, exp.train.clip_high, exp.train.loss_agg, exp.train.kl_coef) == (0.2, 0.28,
                                                                                               "token-mean", 0.0)
    assert exp.method.max_length == exp.sampling.max_new_tokens
    assert compose(["method=dapo", "method.cache_length=16"]).method.cache_length == 16


def test_train_dapo_runs_one_step(tmp_path):
    run = tmp_path / "runs" / "dapo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    args = ["train", f"run.dir={run}", "experiment=dapo", "method.max_length=32", "method.cache_length=8",
            "sampling.max_new_tokens=32", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=2",
            "train.steps=1", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=0",
            "train.eval_problems=2", "train.eval_samples=2"]
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = pq.read_table(run / "train/metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1]
    assert math.isfinite(metrics[0]["loss"])
    assert (run / "train/checkpoints/final/model.safetensors").exists()
