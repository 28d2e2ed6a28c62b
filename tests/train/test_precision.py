"""Training precision and memory options change how an update is computed, not what it is:
micro-batches with accumulation and gradient checkpointing give the one-pass update; bf16-mixed
(float32 master weights) moves the weights fp32 moves, where pure bf16 loses small steps; fp16
trains with loss scaling; checkpoints come out in the model's dtype."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rredcot_cli.train import trainable
from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model
from rredcot_cli.train.precision import GradientStepper, resolve_precision
from rredcot_cli.train.loss import LossSettings
from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
from rredcot_cli.policy.logprobs import ForwardPass

TOKENIZER = build_char_tokenizer()
PROMPTS = [TOKENIZER(t)["input_ids"] for t in ["3+4\n", "ab\n", "7*2-1\n", "q\n", "x=3?\n", "9-9\n"]]
COMPLETIONS = [TOKENIZER(t)["input_ids"] for t in ["7", "ok ok", "13\nAnswer: 3", "no", "x=3: f=1 no", "0\n0"]]


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return build_tiny_model(len(TOKENIZER), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64).eval()


def _advantages(seed=0):
    T = max(len(c) for c in COMPLETIONS)
    adv = torch.randn(len(COMPLETIONS), 1, generator=torch.Generator().manual_seed(seed)).expand(-1, T).clone()
    for i, c in enumerate(COMPLETIONS):
        adv[i, len(c):] = 0
    return adv


def _update(model, *, lr=1e-3, precision="fp32", micro=0, chunk=0, loss_agg="token-mean", temperature=1.0,
            top_p=1.0, updates=2, sampler=None, correction="none", sgd=False):
    prec = resolve_precision(precision, "float32")
    # SGD for equality tests: Adam's per-weight normalisation would hide a wrongly scaled gradient.
    opt = torch.optim.SGD(model.parameters(), lr=lr) if sgd else torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    forward = ForwardPass(temperature=temperature, top_p=top_p, chunk_tokens=chunk, micro_batch_size=micro,
                          autocast=lambda: prec.autocast("cpu"))
    return policy_update(
        model, opt, sched,
        UpdateBatch(prompt_ids=PROMPTS, completion_ids=COMPLETIONS, advantages=_advantages(), pad_id=0,
                    sampler_logprobs=sampler),
        UpdateHyper(updates_per_batch=updates, minibatch_size=4, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg=loss_agg, max_tokens=12), sampler_correction=correction),
        UpdateEngine(generator=torch.Generator().manual_seed(0), forward=forward, stepper=GradientStepper(prec,
                     "cpu")))


def _moved(before, after):
    return {k: (after[k].float() - before[k].float()).abs() for k in before}


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "constant"])
def test_micro_batches_accumulate_to_the_one_pass_update(base_model, loss_agg):
    ref = copy.deepcopy(base_model)
    ref_stats = _update(ref, loss_agg=loss_agg, lr=0.5, sgd=True)
    for micro in (1, 3):
        model = copy.deepcopy(base_model)
        stats = _update(model, loss_agg=loss_agg, micro=micro, chunk=5, lr=0.5, sgd=True)
        for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
            assert torch.allclose(a, b, atol=1e-6), (micro, name, (a - b).abs().max())
        assert stats.loss == pytest.approx(ref_stats.loss, abs=1e-5)
        assert stats.clip_fraction == pytest.approx(ref_stats.clip_fraction, abs=1e-6)
        assert stats.grad_norm == pytest.approx(ref_stats.grad_norm, rel=1e-5)
    assert not torch.equal(ref.state_dict()["lm_head.weight"], base_model.state_dict()["lm_head.weight"])


def test_gradient_checkpointing_gives_the_same_update(base_model):
    plain, checkpointed = copy.deepcopy(base_model), copy.deepcopy(base_model)
    trainable.prepare(checkpointed, resolve_precision("fp32", "float32"), gradient_checkpointing=True)
    assert trainable.checkpointing_active(checkpointed) and not trainable.checkpointing_active(plain)
    _update(plain, lr=0.5, sgd=True)
    _update(checkpointed, lr=0.5, sgd=True)
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_bf16_mixed_moves_the_weights_fp32_moves_at_lr_1e_6(base_model):
    """A pure-bf16 AdamW step of ~1e-6 is below bf16's resolution for most weights (the bug this
    guards against); float32 master weights under bf16 autocast keep it."""
    start = copy.deepcopy(base_model).state_dict()
    fp32 = copy.deepcopy(base_model)
    _update(fp32, lr=1e-6, updates=1)
    mixed = trainable.prepare(copy.deepcopy(base_model), resolve_precision("bf16-mixed", "bfloat16"),
                              gradient_checkpointing=False)
    assert next(mixed.parameters()).dtype == torch.float32
    _update(mixed, lr=1e-6, precision="bf16-mixed", updates=1)
    pure = trainable.prepare(copy.deepcopy(base_model), resolve_precision("bf16-true", "bfloat16"),
                             gradient_checkpointing=False)
    _update(pure, lr=1e-6, precision="bf16-true", updates=1)
    pure_start = {k: v.to(torch.bfloat16) for k, v in start.items()}

    moved_fp32 = torch.cat([d.flatten() for d in _moved(start, fp32.state_dict()).values()]) > 0
    moved_mixed = torch.cat([d.flatten() for d in _moved(start, mixed.state_dict()).values()]) > 0
    moved_pure = torch.cat([d.flatten() for d in _moved(pure_start, pure.state_dict()).values()]) > 0
    share_mixed = float((moved_mixed & moved_fp32).sum() / moved_fp32.sum())
    share_pure = float((moved_pure & moved_fp32).sum() / moved_fp32.sum())
    assert moved_fp32.float().mean() > 0.9
    assert share_mixed > 0.99, share_mixed
    assert share_pure < 0.2, share_pure  # what training in pure bf16 at lr 1e-6 does


def test_fp16_mixed_trains_with_loss_scaling_and_counts_overflows_apart(base_model, monkeypatch):
    model = trainable.prepare(copy.deepcopy(base_model), resolve_precision("fp16-mixed", "float16"),
                              gradient_checkpointing=False)
    before = copy.deepcopy(model.state_dict())
    stats = _update(model, precision="fp16-mixed")
    assert stats.updates == 4 and stats.skipped == 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())

    # A loss whose scaled gradient overflows: skipped by the scaler, not counted as divergence.
    from rredcot_cli.train import update
    from rredcot_cli.train.loss import policy_loss

    def huge(*args, **kwargs):
        loss, stats = policy_loss(*args, **kwargs)
        return loss * 1e38, stats

    monkeypatch.setattr(update, "policy_loss", huge)
    stats = _update(model, precision="fp16-mixed", updates=1)
    assert stats.overflow_skipped >= 1 and stats.skipped == 0 and stats.trailing_skipped == 0


def test_precision_names():
    assert resolve_precision("auto", "float32").name == "fp32"
    assert resolve_precision("auto", "bfloat16").name == "bf16-mixed"
    assert resolve_precision("auto", "float16").name == "fp16-mixed"
    mixed = resolve_precision("bf16-mixed", "float32")
    assert (mixed.param_dtype, mixed.compute_dtype) == (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="train.precision=fp8: unknown; valid"):
        resolve_precision("fp8", "float32")


def test_reference_is_frozen_in_the_compute_dtype(base_model):
    model = trainable.prepare(copy.deepcopy(base_model), resolve_precision("bf16-mixed", "bfloat16"),
                              gradient_checkpointing=True)
    ref, ref_forward = trainable.reference(model, resolve_precision("bf16-mixed", "bfloat16"), ForwardPass())
    assert ref_forward == ForwardPass()
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in ref.parameters())
    assert trainable.checkpointing_active(model) and not trainable.checkpointing_active(ref)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_checkpoint_comes_out_in_the_model_dtype_with_tied_weights(base_model, tmp_path):
    from transformers import AutoModelForCausalLM

    model = trainable.prepare(copy.deepcopy(base_model), resolve_precision("bf16-mixed", "bfloat16"),
                              gradient_checkpointing=False)
    trainable.export_checkpoint(model, TOKENIZER, tmp_path, torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the trained copy is untouched
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    for name, p in loaded.state_dict().items():
        assert torch.equal(p, model.state_dict()[name].to(torch.bfloat16)), name


def test_gradients_are_freed_after_an_update(base_model):
    """They are not needed until the next update; kept, they cost 4 bytes per weight through sampling."""
    model = copy.deepcopy(base_model)
    _update(model)
    assert all(p.grad is None for p in model.parameters())
