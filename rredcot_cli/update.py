"""One policy update on a sampled batch: old log-probs, then several clipped-ratio minibatch steps.

Kept apart from the training stage so the stage reads as sample -> segment -> attribute ->
update, and so tests can drive an update on hand-made tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rredcot_cli.loss import policy_loss


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """Multiplier of the base learning rate at optimizer step s: linear warmup, then
    constant, linear decay to 0, or cosine decay to 0."""
    if schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown lr schedule {schedule!r}; valid: constant, linear, cosine")

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@dataclass
class UpdateStats:
    loss: float
    clip_fraction: float
    kl_ref: float
    approx_kl_old: float
    entropy: float
    grad_norm: float
    lr: float
    skipped: int  # minibatch steps skipped because the loss or the gradient was not finite
    updates: int  # minibatch steps taken
    trailing_skipped: int  # skipped steps after the last one taken (all of them if none was)


def padded_completion_logprobs(model, prompt_ids, completion_ids, pad_id, with_entropy: bool):
    """(B, T) log-probs, mask and entropies (or None) of the completion tokens, T = longest
    completion, on the model's device."""
    from rredcot_cli.backends.hf import completion_logprobs

    return completion_logprobs(model, prompt_ids, completion_ids, pad_id, with_entropy=with_entropy)


@torch.no_grad()
def chunked_completion_logprobs(model, prompt_ids, completion_ids, pad_id, chunk_size):
    """Like ``padded_completion_logprobs`` without gradients, ``chunk_size`` sequences at a time
    so a large batch does not hold every sequence's logits at once."""
    B = len(completion_ids)
    T = max((len(c) for c in completion_ids), default=0)
    logprobs = torch.zeros(B, T)
    mask = torch.zeros(B, T, dtype=torch.bool)
    entropies = torch.zeros(B, T)
    for start in range(0, B, chunk_size):
        end = min(B, start + chunk_size)
        lp, m, ent = padded_completion_logprobs(model, prompt_ids[start:end], completion_ids[start:end], pad_id, True)
        t = lp.shape[1]
        logprobs[start:end, :t] = lp.float().cpu()
        mask[start:end, :t] = m.cpu()
        entropies[start:end, :t] = ent.float().cpu()
    return logprobs, mask, entropies


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    advantages: torch.Tensor,
    pad_id: int,
    reference: torch.nn.Module | None,
    updates_per_batch: int,
    minibatch_size: int,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    max_tokens: int,
    kl_coef: float,
    kl_estimator: str,
    grad_clip: float,
    generator: torch.Generator,
) -> UpdateStats:
    """``updates_per_batch`` passes over the batch in shuffled minibatches.

    advantages: (B, T) with T = the longest completion; zero on padding. The old log-probs are
    the policy's own before the first step (so the first minibatch step has ratio 1). A minibatch
    whose loss or gradient norm is not finite changes nothing (no optimizer or scheduler step);
    ``skipped`` and ``trailing_skipped`` count them so the caller can stop a run that diverged."""
    B = len(completion_ids)
    model.eval()
    old_logprobs, mask, entropies = chunked_completion_logprobs(model, prompt_ids, completion_ids, pad_id, minibatch_size)
    ref_logprobs = None
    if reference is not None and kl_coef != 0.0:
        ref_logprobs, _, _ = chunked_completion_logprobs(reference, prompt_ids, completion_ids, pad_id, minibatch_size)
    entropy = float((entropies * mask).sum() / mask.sum().clamp(min=1))

    model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl_ref": 0.0, "approx_kl_old": 0.0, "grad_norm": 0.0}
    steps = skipped = trailing = 0
    for _ in range(updates_per_batch):
        order = torch.randperm(B, generator=generator).tolist()
        for start in range(0, B, minibatch_size):
            idx = order[start : start + minibatch_size]
            logprobs, mb_mask, _ = padded_completion_logprobs(
                model, [prompt_ids[i] for i in idx], [completion_ids[i] for i in idx], pad_id, with_entropy=False
            )
            T = logprobs.shape[1]  # the minibatch's longest completion

            def on_device(x: torch.Tensor) -> torch.Tensor:
                return x[idx, :T].to(logprobs.device)

            loss, stats = policy_loss(
                logprobs,
                on_device(old_logprobs),
                on_device(advantages),
                mb_mask,
                clip_low=clip_low,
                clip_high=clip_high,
                loss_agg=loss_agg,
                max_tokens=max_tokens,
                ref_logprobs=None if ref_logprobs is None else on_device(ref_logprobs),
                kl_coef=kl_coef,
                kl_estimator=kl_estimator,
            )
            optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                skipped += 1
                trailing += 1
                continue
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
            if not torch.isfinite(grad_norm):
                # A finite loss can still have an inf/NaN gradient; one such step would poison the
                # weights and the optimizer moments for good, so it is skipped like a NaN loss.
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                trailing += 1
                continue
            optimizer.step()
            scheduler.step()
            steps += 1
            trailing = 0
            for key in ("loss", "clip_fraction", "kl_ref", "approx_kl_old"):
                totals[key] += getattr(stats, key)
            totals["grad_norm"] += float(grad_norm)
    model.eval()
    # With every step skipped there is no loss to report: NaN says so in the metrics.
    mean = {k: v / steps if steps else float("nan") for k, v in totals.items()}
    return UpdateStats(entropy=entropy, lr=scheduler.get_last_lr()[0], skipped=skipped, updates=steps,
                       trailing_skipped=trailing, **mean)
