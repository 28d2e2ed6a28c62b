"""A batch whose advantages are all exactly 0 (all rewards equal under GRPO, no KL term) runs no
forward or backward pass, yet leaves the weights, the optimizer, the scheduler and the minibatch
generator exactly where the full update leaves them (issue 27, defect 6: 177 s of a 243 s GSM8K
step on SmolLM2 went into an update whose loss was 0)."""

from __future__ import annotations

import copy

import pytest
import torch

from rredcot_cli.train import update
from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model
from rredcot_cli.train.precision import GradientStepper, resolve_precision
from rredcot_cli.train.loss import LossSettings
from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
from rredcot_cli.policy.logprobs import ForwardPass

TOKENIZER = build_char_tokenizer()
PROMPTS = [TOKENIZER(t)["input_ids"] for t in ["3+4\n", "ab\n", "7*2-1\n", "q\n", "x=3?\n"]]
COMPLETIONS = [TOKENIZER(t)["input_ids"] for t in ["7", "ok ok", "13\nAnswer: 3", "no", "x=3: f=1 no"]]
T = max(len(c) for c in COMPLETIONS)


def _signal():
    adv = torch.randn(len(COMPLETIONS), 1, generator=torch.Generator().manual_seed(1)).expand(-1, T).clone()
    for i, c in enumerate(COMPLETIONS):
        adv[i, len(c):] = 0
    return adv


class Counting(torch.nn.Module):
    """The model, counting its forward calls."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


def _trainer(precision="fp32", weight_decay=0.1):
    torch.manual_seed(0)
    model = build_tiny_model(len(TOKENIZER), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    prec = resolve_precision(precision, "float32")
    return {"model": model, "opt": opt, "sched": sched, "generator": torch.Generator().manual_seed(0),
            "stepper": GradientStepper(prec, "cpu"), "forward": ForwardPass(autocast=lambda: prec.autocast("cpu"))}


def _update(t, advantages, model=None, kl_coef=0.0, reference=None):
    return policy_update(
        model or t["model"], t["opt"], t["sched"],
        UpdateBatch(prompt_ids=PROMPTS, completion_ids=COMPLETIONS, advantages=advantages, pad_id=0),
        UpdateHyper(updates_per_batch=2, minibatch_size=2, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg="token-mean", max_tokens=12, kl_coef=kl_coef)),
        UpdateEngine(generator=t["generator"], forward=t["forward"], reference=reference, stepper=t["stepper"]))


def test_a_batch_without_signal_runs_no_forward_pass():
    t = _trainer()
    _update(t, _signal())  # momentum, so that a zero-gradient AdamW step still moves the weights
    counting = Counting(t["model"])
    stats = _update(t, torch.zeros(len(COMPLETIONS), T), model=counting)
    assert counting.calls == 0
    assert stats.updates == 2 * 3 and stats.loss == 0.0 and stats.grad_norm == 0.0


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_skipping_the_passes_changes_no_number(monkeypatch, precision):
    """Same weights, optimizer moments, learning rate and generator state as running the passes,
    bit for bit, and the next real update from there is the same too."""
    full, fast = _trainer(precision), _trainer(precision)
    for t in (full, fast):
        _update(t, _signal())
    zeros = torch.zeros(len(COMPLETIONS), T)
    with monkeypatch.context() as m:
        m.setattr(update, "carries_no_signal", lambda *a: False)  # today's path: every pass run
        full_stats = _update(full, zeros)
    fast_stats = _update(fast, zeros)
    assert fast_stats.updates == full_stats.updates and full_stats.loss == 0.0 and full_stats.grad_norm == 0.0
    for t in (full, fast):
        _update(t, _signal())
    for (name, a), b in zip(full["model"].state_dict().items(), fast["model"].state_dict().values()):
        assert torch.equal(a, b), name
    for sa, sb in zip(full["opt"].state.values(), fast["opt"].state.values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert full["sched"].get_last_lr() == fast["sched"].get_last_lr()
    assert torch.equal(full["generator"].get_state(), fast["generator"].get_state())


def test_a_kl_term_or_any_nonzero_advantage_runs_the_full_update():
    t = _trainer()
    reference = copy.deepcopy(t["model"])
    zeros = torch.zeros(len(COMPLETIONS), T)
    assert update.carries_no_signal(zeros, None, 0.1)
    assert update.carries_no_signal(zeros, reference, 0.0)
    assert not update.carries_no_signal(zeros, reference, 0.1)
    one = zeros.clone()
    one[2, 3] = 1e-30
    assert not update.carries_no_signal(one, None, 0.0)
    counting = Counting(t["model"])
    _update(t, zeros, model=counting, kl_coef=0.1, reference=reference)
    assert counting.calls > 0
