"""Issue 29 item 3: the sampler/trainer mismatch every step (rredcot_cli/train/mismatch.py) and the
menu of corrections (loss.sampler_correction_weights), on hand-computed tensors; the policy
update's two ways of measuring it (the pre-update pass, or the first minibatch's forwards when the
sampler's log-probs stand in for it); and `rredcot train experiment=quick` writing the
``mismatch_*`` columns to metrics.parquet and the trackers (HF here, vLLM in the ``vllm`` lane)."""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rredcot_cli.train.loss import sampler_correction_weights
from rredcot_cli.train.mismatch import COLUMNS, MismatchStats, MismatchSums, mismatch_stats, mismatch_sums

REPO = Path(__file__).resolve().parents[2]
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


# --------------------------------------------------------------------------- the statistics by hand


def _pair():
    """(2, 3) trainer and sampler log-probs: row 0 delta = log 3, log 0.5, padding (a huge
    difference there that must not count); row 1 delta = 0, log 1.5, log 0.25."""
    sampler = torch.log(torch.tensor([[0.2, 0.2, 0.1], [0.4, 0.2, 0.8]]))
    trainer = torch.log(torch.tensor([[0.6, 0.1, 1e-9], [0.4, 0.3, 0.2]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    return trainer, sampler, mask


def test_mismatch_statistics_by_hand():
    trainer, sampler, mask = _pair()
    deltas = [math.log(3), math.log(0.5), 0.0, math.log(1.5), math.log(0.25)]
    stats = mismatch_stats(trainer, sampler, mask, cap=2.0)
    assert stats.tokens == 5
    assert stats.logp_abs_mean == pytest.approx(sum(abs(d) for d in deltas) / 5, rel=1e-6)
    assert stats.logp_abs_max == pytest.approx(math.log(4), rel=1e-6)  # |log 0.25|
    # k3 = rho - 1 - log rho per token: 3 - 1 - log 3, 0.5 - 1 - log 0.5, 0, 1.5 - 1 - log 1.5, 0.25 - 1 - log 0.25
    k3 = [math.exp(d) - 1 - d for d in deltas]
    assert stats.kl == pytest.approx(sum(k3) / 5, rel=1e-6)
    assert all(v >= 0 for v in k3)
    assert stats.past_cap == pytest.approx(1 / 5)  # only rho = 3 > 2 (0.25 is below 1/2, not past the cap)
    assert mismatch_stats(trainer, sampler, mask, cap=1.4).past_cap == pytest.approx(2 / 5)  # 3 and 1.5
    assert set(stats.columns()) == set(COLUMNS) and all(c.startswith("mismatch_") for c in COLUMNS)
    with pytest.raises(ValueError, match="> 0"):
        mismatch_stats(trainer, sampler, mask, cap=0.0)


def test_identical_numbers_have_no_mismatch_and_tiny_ones_do_not_cancel():
    lp = torch.log(torch.tensor([[0.3, 0.6]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    same = mismatch_stats(lp, lp, mask, cap=2.0)
    assert (same.logp_abs_mean, same.logp_abs_max, same.kl, same.past_cap, same.tokens) == (0.0, 0.0, 0.0, 0.0, 2)
    # delta = 1e-7: k3 ~ delta^2 / 2 = 5e-15, computed in float64 with expm1 (float32 would give 0)
    tiny = mismatch_stats(torch.tensor([[1e-7, -1e-7]], dtype=torch.float64), torch.zeros(1, 2), mask, cap=2.0)
    assert tiny.kl == pytest.approx(5e-15, rel=1e-3)


def test_nothing_measured_is_nan_with_zero_tokens():
    empty = MismatchStats()
    assert math.isnan(empty.logp_abs_mean) and math.isnan(empty.kl) and empty.tokens == 0
    none = mismatch_stats(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), cap=2.0)
    assert math.isnan(none.logp_abs_max) and math.isnan(none.past_cap) and none.tokens == 0


def test_sums_over_micro_batches_and_ranks_equal_the_whole_batch():
    trainer, sampler, mask = _pair()
    whole = mismatch_stats(trainer, sampler, mask, cap=2.0)
    parts = MismatchSums()
    for rows in ([0], [1]):
        parts.add(mismatch_sums(trainer[rows], sampler[rows], mask[rows], cap=2.0))
    _close(parts.stats(), whole)

    class Capture:  # an all-reduce over two ranks: this rank's vector plus the other's
        world_size = 2

        def __init__(self, rank, other=None):
            self.rank, self.other, self.sent = rank, other, None

        def sum(self, values):
            self.sent = list(values)
            return [a + b for a, b in zip(values, self.other)] if self.other else list(values)

    shares = [mismatch_sums(trainer[[r]], sampler[[r]], mask[[r]], 2.0) for r in (0, 1)]
    rank1 = Capture(1)
    shares[1].over_ranks(rank1)
    _close(shares[0].over_ranks(Capture(0, rank1.sent)).stats(), whole)


def _close(a: MismatchStats, b: MismatchStats) -> bool:
    assert a.tokens == b.tokens
    for name in ("logp_abs_mean", "logp_abs_max", "kl", "past_cap"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-12, abs=1e-15), name
    return True


# --------------------------------------------------------------------------- the corrections by hand


def _ratios():
    """log rho = log pi_old - log pi_sampler per token (the trainer's ``old`` against the sampler):
    row 0: 3, 0.5 (geometric mean sqrt 1.5 = 1.22); row 1: 3, 3 (geometric mean 3);
    row 2: 0.25, 0.5 (geometric mean sqrt 0.125 = 0.354); row 3: no tokens."""
    sampler = torch.log(torch.tensor([[0.2, 0.2, 0.9], [0.1, 0.2, 0.9], [0.8, 0.4, 0.9], [0.5, 0.5, 0.5]]))
    rho = torch.tensor([[3.0, 0.5, 1.0], [3.0, 3.0, 1.0], [0.25, 0.5, 1.0], [1.0, 1.0, 1.0]])
    old = sampler + torch.log(rho)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    return old, sampler, mask


def test_token_truncate_is_bit_identical_to_the_formula_it_had():
    old, sampler, mask = _ratios()
    maskf = mask.float()
    before = torch.exp(((old - sampler) * maskf).clamp(max=50.0)).clamp(max=2.0) * maskf
    assert torch.equal(sampler_correction_weights(old, sampler, mask, "token_truncate", 2.0), before)
    w = sampler_correction_weights(old, sampler, mask, "token_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0], [2.0, 2.0, 0], [0.25, 0.5, 0], [0, 0, 0]]))


def test_token_mask_drops_the_tokens_past_the_cap_instead_of_truncating_them():
    old, sampler, mask = _ratios()
    w = sampler_correction_weights(old, sampler, mask, "token_mask", 2.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0.5, 0], [0.0, 0.0, 0], [0.25, 0.5, 0], [0, 0, 0]]))


def test_sequence_corrections_by_hand():
    old, sampler, mask = _ratios()
    # prod rho: row 0 1.5, row 1 9, row 2 0.125
    w = sampler_correction_weights(old, sampler, mask, "sequence_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0], [2.0, 2.0, 0], [0.125, 0.125, 0], [0, 0, 0]]))
    w = sampler_correction_weights(old, sampler, mask, "sequence_mask", 2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0], [0.0, 0.0, 0], [0.125, 0.125, 0], [0, 0, 0]]))


def test_geometric_mask_keeps_rows_whose_geometric_mean_ratio_is_within_the_cap_both_ways():
    old, sampler, mask = _ratios()
    # geometric means 1.22 (kept), 3 (> 2: dropped), 0.354 (< 1/2: dropped); the empty row 0
    w = sampler_correction_weights(old, sampler, mask, "geometric_mask", 2.0)
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]))
    # a wider cap keeps row 2 too (0.354 >= 1/3) but not row 1 (3 > 2.9)
    w = sampler_correction_weights(old, sampler, mask, "geometric_mask", 2.9)
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 0], [0, 0, 0], [1.0, 1.0, 0], [0, 0, 0]]))
    # the mean is over the row's tokens, so a long row is not dropped for its length (prod would be)
    long = torch.log(torch.full((1, 40), 1.1))
    assert torch.equal(sampler_correction_weights(long, torch.zeros(1, 40), torch.ones(1, 40, dtype=torch.bool),
                                                  "geometric_mask", 2.0), torch.ones(1, 40))
    for cap in (1.0, 0.5):
        with pytest.raises(ValueError, match="cap > 1"):
            sampler_correction_weights(old, sampler, mask, "geometric_mask", cap)


def test_geometric_mask_with_a_cap_not_above_one_is_refused_before_the_run(tmp_path):
    from rredcot_cli.config.compose import compose
    from rredcot_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="must be > 1"):
        compose([f"run.dir={tmp_path}", "train.sampler_correction=geometric_mask", "train.sampler_correction_cap=1.0"])
    compose([f"run.dir={tmp_path}", "train.sampler_correction=geometric_mask"])


# --------------------------------------------------------------------------- inside the policy update


def _update(model, *, sampler, old_from_sampler, minibatch_size=6, advantages=None, cap=2.0, correction="none"):
    from rredcot_cli.policy.models import build_char_tokenizer
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.train.loss import LossSettings

    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in ["3+4\n", "ab\n", "7*2-1\n", "q\n", "x=3?\n", "9-9\n"]]
    completions = [tok(t)["input_ids"] for t in ["7", "ok ok", "13\nAnswer: 3", "no", "x=3: f=1 no", "0\n0"]]
    T = max(len(c) for c in completions)
    if advantages is None:
        advantages = torch.randn(len(completions), 1, generator=torch.Generator().manual_seed(0)).expand(-1,
                                 T).clone()
        for i, c in enumerate(completions):
            advantages[i, len(c):] = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return policy_update(
        model, opt, sched,
        UpdateBatch(prompt_ids=prompts, completion_ids=completions, advantages=advantages, pad_id=0,
                    sampler_logprobs=sampler(model, prompts, completions) if callable(sampler) else sampler),
        UpdateHyper(updates_per_batch=2, minibatch_size=minibatch_size, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg="token-mean", max_tokens=12), old_from_sampler=old_from_sampler,
                    sampler_correction=correction, sampler_cap=cap),
        UpdateEngine(generator=torch.Generator().manual_seed(0), forward=ForwardPass(chunk_tokens=5)))


def _shifted(shift):
    """The sampler's log-probs: the model's own, teacher-forced, minus ``shift`` on every token
    (so delta = +shift everywhere)."""
    def sampler(model, prompts, completions):
        from rredcot_cli.policy.logprobs import chunked_completion_logprobs

        lp, mask, _ = chunked_completion_logprobs(model, prompts, completions, 0, 6)
        return (lp - shift) * mask
    return sampler


@pytest.fixture()
def tiny_policy():
    from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(len(build_char_tokenizer()), hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64).eval()


TOKENS = 1 + 5 + 12 + 2 + 11 + 3  # the completions' lengths


@pytest.mark.parametrize("old_from_sampler", [False, True], ids=["pre-update pass", "first forwards"])
def test_the_update_measures_the_mismatch_of_the_policy_that_sampled(tiny_policy, old_from_sampler):
    shift = 0.1
    stats = _update(copy.deepcopy(tiny_policy), sampler=_shifted(shift), old_from_sampler=old_from_sampler,
                    cap=1.05)
    m = stats.mismatch
    assert m.tokens == TOKENS
    assert m.logp_abs_mean == pytest.approx(shift, abs=1e-5) and m.logp_abs_max == pytest.approx(shift, abs=1e-5)
    assert m.kl == pytest.approx(math.exp(shift) - 1 - shift, rel=1e-3)
    assert m.past_cap == 1.0  # exp(0.1) = 1.105 > 1.05 everywhere
    assert math.isnan(stats.sampler_kl) == old_from_sampler  # the pass sampler_kl needs is skipped
    if not old_from_sampler:
        assert stats.sampler_kl == pytest.approx(-shift, abs=1e-5)


def test_first_forwards_measure_only_the_minibatches_before_the_first_step(tiny_policy):
    """With the sampler's log-probs as the old ones and several minibatches, only the first
    minibatch's forwards see the weights that sampled; later ones see updated weights."""
    stats = _update(copy.deepcopy(tiny_policy), sampler=_shifted(0.0), old_from_sampler=True, minibatch_size=4)
    assert 0 < stats.mismatch.tokens < TOKENS and stats.updates == 4
    assert stats.mismatch.logp_abs_max < 1e-5  # the sampler's numbers are the model's own


def test_a_batch_without_signal_measures_no_mismatch(tiny_policy):
    stats = _update(copy.deepcopy(tiny_policy), sampler=_shifted(0.1), old_from_sampler=False,
                    advantages=torch.zeros(6, 12))
    assert stats.mismatch.tokens == 0 and all(math.isnan(getattr(stats.mismatch, k))
                                              for k in ("logp_abs_mean", "logp_abs_max", "kl", "past_cap"))


def test_geometric_mask_drops_shifted_rows_from_the_gradient(tiny_policy):
    """The trainer 1 nat below the sampler on every token (geometric-mean ratio 1/e = 0.37 < 1/2)
    masks every row with cap 2: no policy-gradient signal, the weights do not move; with cap 3
    (1/3 < 0.37) every row is kept and they do."""
    before = copy.deepcopy(tiny_policy).state_dict()
    masked = copy.deepcopy(tiny_policy)
    stats = _update(masked, sampler=_shifted(-1.0), old_from_sampler=False, correction="geometric_mask", cap=2.0)
    assert stats.mismatch.past_cap == 0.0 and stats.mismatch.logp_abs_mean == pytest.approx(1.0, abs=1e-5)
    assert all(torch.equal(before[k], v) for k, v in masked.state_dict().items())
    kept = copy.deepcopy(tiny_policy)
    _update(kept, sampler=_shifted(-1.0), old_from_sampler=False, correction="geometric_mask", cap=3.0)
    assert any(not torch.equal(before[k], v) for k, v in kept.state_dict().items())


# --------------------------------------------------------------------------- a real run


def _train(run: Path, *extra: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", "experiment=quick", "method=grpo",
                             f"run.dir={run}", *extra], cwd=run.parent, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"train failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return pq.read_table(run / "train" / "metrics.parquet").to_pylist()


def _assert_sane(metrics: list[dict], *, abs_max: float, kl_max: float) -> None:
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        tokens = round(m["response_tokens_mean"] * 8)  # experiment=quick: 2 prompts x 4 completions
        assert m["mismatch_tokens"] == tokens, m
        assert 0 <= m["mismatch_logp_abs_mean"] <= m["mismatch_logp_abs_max"] <= abs_max, m
        assert 0 <= m["mismatch_kl"] <= kl_max and m["mismatch_past_cap"] == 0.0, m
        if m["sampler_kl"] is not None:
            assert abs(m["sampler_kl"]) <= m["mismatch_logp_abs_mean"] + 1e-9


@pytest.mark.parametrize("extra", [[], ["train.old_logprobs=recompute", "train.sampler_correction=geometric_mask"]],
                         ids=["default: first forwards", "recompute + geometric_mask"])
def test_hf_train_writes_the_mismatch_columns(tmp_path, extra):
    """The HF sampler is the trained module in fp32: the two differ by float rounding only."""
    run = tmp_path / "run"
    metrics = _train(run, *extra, *(["tracking=[tensorboard]"] if HAS_TENSORBOARD else []))
    _assert_sane(metrics, abs_max=1e-4, kl_max=1e-8)
    if not HAS_TENSORBOARD:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "train" / "tensorboard"))
    events.Reload()
    for key in COLUMNS:
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert logged == [(m["step"], pytest.approx(m[key], rel=1e-5, abs=1e-30)) for m in metrics], key


@pytest.mark.vllm
def test_vllm_train_writes_the_mismatch_columns(tmp_path):
    """backend=vllm (the CPU build, float32): other kernels than the trainer's, measured on the
    pre-update pass (with vLLM the old log-probs are always recomputed). Measured on 2026-12-04:
    mean |delta| 3.5e-8 and 4.1e-8, max 3.8e-6 and 1.9e-6, k3 3e-14 and 2e-14: float rounding."""
    pytest.importorskip("vllm")
    run = tmp_path / "run"
    metrics = _train(run, "backend=vllm")
    assert "name: vllm" in (run / "train" / "config.yaml").read_text()
    _assert_sane(metrics, abs_max=1e-3, kl_max=1e-6)
    assert all(m["sampler_kl"] is not None and m["mismatch_logp_abs_max"] > 0 for m in metrics)
    for m in metrics:
        print({k: m[k] for k in COLUMNS})
