"""One policy update on a sampled batch: old log-probs, then several clipped-ratio minibatch steps.

Kept apart from the training stage so the stage reads as sample -> segment -> attribute ->
update, and so tests can drive an update on hand-made tensors. How the model is run (the
sampling distribution the log-probs are taken under, autocast, chunked LM head, micro-batches)
is one ``ForwardPass``; how a gradient becomes a step (loss scaling, clipping, skipping
non-finite steps) is a ``precision.GradientStepper``.
"""

from __future__ import annotations

import functools
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from rredcot_cli.train.batching import advantage_signs, minibatch_rows
from rredcot_cli.train.distributed import DataParallel, is_logprob_root, split_evenly
from rredcot_cli.policy.logprobs import completion_logprobs
from rredcot_cli.train.loss import loss_normalizer, policy_loss, sampler_correction_weights
from rredcot_cli.train.mismatch import MismatchStats, MismatchSums, mismatch_stats, mismatch_sums
from rredcot_cli.train.precision import GradientStepper, Precision
from rredcot_cli.train.steptime import StepClock, phase


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


@dataclass(frozen=True)
class ForwardPass:
    """How the trained model is run over completions.

    ``temperature``/``top_p``: the sampling distribution, so log-probs (old, new, reference) are
    those of the distribution the completions were drawn from. ``chunk_tokens``: LM-head chunk
    (``logprobs.completion_logprobs``; 0 = one pass). ``micro_batch_size``: rows per forward and
    backward, gradients accumulated over a minibatch (0 = the whole minibatch at once).
    ``micro_batch_tokens``: also at most this many padded positions per forward (0 = no limit);
    with it, rows are sorted by length before they are cut into micro-batches (``micro_batches``),
    so each pass pads to rows of similar length. ``autocast``: the precision context
    (``Precision.autocast``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    chunk_tokens: int = 0
    micro_batch_size: int = 0
    micro_batch_tokens: int = 0
    autocast: Callable[[], ContextManager] = field(default=nullcontext)

    def logprobs(self, model, prompt_ids, completion_ids, pad_id, with_entropy: bool):
        """(B, T) log-probs, mask and entropies (or None), T = longest completion, on the model's
        device. ``model`` is an HF model or a data-parallel ``CompletionLogprobs`` root
        (``distributed.py``), which is called so that its hooks run."""
        score = model if is_logprob_root(model) else functools.partial(completion_logprobs, model)
        with self.autocast():
            return score(prompt_ids, completion_ids, pad_id, with_entropy,
                         temperature=self.temperature, top_p=self.top_p, chunk_tokens=self.chunk_tokens)

    def rows_per_pass(self, minibatch_size: int) -> int:
        return self.micro_batch_size if 0 < self.micro_batch_size < minibatch_size else minibatch_size


OLD_LOGPROBS = ("auto", "recompute", "sampler")


def old_from_sampler(choice: str, backend: str, precision: str, sampler_correction: str,
                     kv_cache_dtype: str = "auto") -> bool:
    """Whether the update takes the sampler's recorded log-probs as its old log-probs
    (``train.old_logprobs``). ``auto`` does so only where sampler and trainer are one model in one
    precision: the HF backend generates with the trained module itself, and in fp32 its recorded
    log-probs equal a teacher-forced pass up to float rounding (measured: at most 6.5e-5 nats,
    mean 6e-8, on 384 completions of the embedded model; ``tests/policy/test_hf_backend.py`` checks
    1e-4). vLLM (other kernels), mixed precision, a 16-bit KV cache in the sampler and a sampler
    correction (which needs both numbers) recompute."""
    if choice not in OLD_LOGPROBS:
        raise ValueError(f"train.old_logprobs={choice}: unknown; valid: {', '.join(OLD_LOGPROBS)}")
    if choice == "sampler" and sampler_correction != "none":
        raise ValueError(f"train.old_logprobs=sampler with train.sampler_correction={sampler_correction}: the "
                         "correction compares the sampler's log-probs with recomputed ones; use recompute")
    if choice == "auto":
        return backend == "hf" and precision == "fp32" and kv_cache_dtype == "auto" and sampler_correction == "none"
    return choice == "sampler"


def auto_micro_batch_tokens(value: int, device: str, world_size: int = 1) -> int:
    """``train.micro_batch_tokens``: -1 (auto) is 1024 positions on CPU in one process, where short
    forwards of similar rows were fastest for the embedded model (docs/studies/throughput.md); no limit on
    GPU, nor under torchrun, where every rank makes as many passes as the one with the most and
    the others would wait in zero-weighted ones."""
    if value >= 0:
        return value
    return 1024 if str(device).startswith("cpu") and world_size == 1 else 0


def micro_batches(rows: list[int], prompt_ids: list[list[int]], completion_ids: list[list[int]], max_rows: int,
                  max_tokens: int = 0) -> list[list[int]]:
    """``rows`` cut into micro-batches of at most ``max_rows`` rows; gradients accumulated over
    them sum to those of one pass over ``rows``. Without ``max_tokens``, consecutive runs of
    ``rows`` in their order. With ``max_tokens`` > 0, ``rows`` sorted by length (prompt +
    completion) and cut so that no micro-batch exceeds that many padded positions (rows x (longest
    prompt + longest completion); a longer single row is a micro-batch alone): rows of similar
    length share a forward, so little of it is padding."""
    if max_tokens <= 0:
        step = max(1, max_rows)
        return [list(rows[k : k + step]) for k in range(0, len(rows), step)]
    order = sorted(rows, key=lambda i: (len(prompt_ids[i]) + len(completion_ids[i]), i))
    out: list[list[int]] = []
    width_p = width_c = 0
    for i in order:
        p, c = max(width_p, len(prompt_ids[i])), max(width_c, len(completion_ids[i]))
        if out and len(out[-1]) < max(1, max_rows) and len(out[-1]) * (p + c) + p + c <= max_tokens:
            out[-1].append(i)
            width_p, width_c = p, c
        else:
            out.append([i])
            width_p, width_c = len(prompt_ids[i]), len(completion_ids[i])
    return out


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
    # Mean over tokens of log pi_sampler - log pi_old (a k1 estimate of KL(sampler || trainer)):
    # how far the numbers the sampler recorded are from the trainer's; NaN without sampler log-probs.
    sampler_kl: float = float("nan")
    overflow_skipped: int = 0  # fp16 loss-scale overflows: skipped and rescaled, never a divergence
    # The sampler/trainer mismatch on the sampled tokens (rredcot_cli/train/mismatch.py): from the
    # pre-update pass, or from the first minibatch's forwards when the sampler's log-probs stand
    # in for it; NaN (0 tokens) where no forward ran.
    mismatch: MismatchStats = field(default_factory=MismatchStats)


def padded_completion_logprobs(model, prompt_ids, completion_ids, pad_id, with_entropy: bool,
                               forward: ForwardPass = ForwardPass()):
    """(B, T) log-probs, mask and entropies (or None) of the completion tokens, T = longest
    completion, on the model's device."""
    return forward.logprobs(model, prompt_ids, completion_ids, pad_id, with_entropy)


@torch.no_grad()
def chunked_completion_logprobs(model, prompt_ids, completion_ids, pad_id, chunk_size,
                                forward: ForwardPass = ForwardPass(), parallel: DataParallel = DataParallel()):
    """Like ``padded_completion_logprobs`` without gradients, ``chunk_size`` sequences at a time
    so a large batch does not hold every sequence's activations at once. CPU float32 tensors.

    With ``parallel`` each rank scores its share of the rows, making as many passes as every
    other rank (sharded weights need all ranks in every pass), and the results are all-gathered."""
    B = len(completion_ids)
    T = max((len(c) for c in completion_ids), default=0)
    shares = [micro_batches(share, prompt_ids, completion_ids, chunk_size, forward.micro_batch_tokens)
              for share in split_evenly(range(B), parallel.world_size)]
    first = sum(len(share) for share in split_evenly(range(B), parallel.world_size)[: parallel.rank])
    mine = shares[parallel.rank]
    count = sum(len(chunk) for chunk in mine)
    logprobs = torch.zeros(count, T)
    mask = torch.zeros(count, T, dtype=torch.bool)
    entropies = torch.zeros(count, T)
    for k in range(max((len(s) for s in shares), default=0)):
        chunk = mine[k] if k < len(mine) else []
        picked = chunk or [0]  # a rank out of rows still takes part in the pass
        lp, m, ent = forward.logprobs(model, [prompt_ids[i] for i in picked], [completion_ids[i] for i in picked],
                                      pad_id, True)
        if not chunk:
            continue
        t, at = lp.shape[1], torch.tensor(chunk) - first  # positions in this rank's share
        logprobs[at, :t] = lp.float().cpu()
        mask[at, :t] = m.cpu()
        entropies[at, :t] = ent.float().cpu()
    return parallel.concat_rows(logprobs, T), parallel.concat_rows(mask, T, False), parallel.concat_rows(entropies, T)


@dataclass(frozen=True)
class UpdateBatch:
    """What one update trains on: the batch's token ids (prompts and completions, unpadded),
    the (B, T) token advantages (T = the longest completion; zero on padding), the pad id,
    the (B, T) log-probs the sampler recorded (or None) and the (B,) prompt group of each row
    (or None; query-preserved minibatches need it, ``batching.py``)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor
    pad_id: int
    sampler_logprobs: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class UpdateHyper:
    """The ``train.*`` hyper-parameters of one policy update: what it computes.

    ``updates_per_batch`` passes over the batch in minibatches of ``minibatch_size`` rows; the
    clipped ratio ``[1 - clip_low, 1 + clip_high]``; ``loss_agg`` and ``max_tokens`` (the
    normaliser, ``loss.loss_normalizer``); ``kl_coef`` x the ``kl_estimator`` (k1/k3) KL to the
    reference, k3 clamped to ``[-kl_clamp, kl_clamp]`` (0: off); the dual clip ``clip_ratio_c``
    for negative advantages (0: off; ``loss.policy_loss``); ``grad_clip`` on the global gradient
    norm; ``sampler_correction`` (capped at ``sampler_cap``) on the policy-gradient term;
    ``old_from_sampler``: take the sampler's log-probs as the old ones instead of the pre-update
    pass (``old_from_sampler()``). ``query_preserved`` / ``reward_balanced``: how each pass cuts
    the batch into minibatches (``batching.minibatch_rows``; both off: shuffled rows).
    ``token_selection``: the credit method's choice of the tokens that carry the policy-gradient
    term, ``fn(entropies (B, T), mask (B, T)) -> (B, T)`` 0/1 weights computed from each forward
    of the update (``MethodSpec.loss_tokens``; e.g. ``methods/high_entropy.py``), or None (all)."""

    updates_per_batch: int
    minibatch_size: int
    clip_low: float
    clip_high: float
    loss_agg: str
    max_tokens: int
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_clamp: float = 0.0
    clip_ratio_c: float = 0.0
    grad_clip: float = 1.0
    sampler_correction: str = "none"
    sampler_cap: float = 2.0
    old_from_sampler: bool = False
    query_preserved: bool = False
    reward_balanced: bool = False
    token_selection: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class UpdateEngine:
    """How an update runs, not what it computes: the minibatch shuffler ``generator``, the
    ``forward`` pass of the trained model, the ``reference`` model (None without a KL term) and
    its ``reference_forward`` (default: ``forward``), the ``stepper`` (default: fp32), the data
    ``parallel`` group and the step ``clock`` (``steptime.StepClock``, or None)."""

    generator: torch.Generator
    forward: ForwardPass = ForwardPass()
    reference: torch.nn.Module | None = None
    reference_forward: ForwardPass | None = None
    stepper: GradientStepper | None = None
    parallel: DataParallel = field(default_factory=DataParallel)
    clock: StepClock | None = None


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: UpdateBatch,
    hyper: UpdateHyper,
    engine: UpdateEngine,
) -> UpdateStats:
    """``hyper.updates_per_batch`` passes over ``batch`` in shuffled minibatches (``UpdateBatch``:
    what it trains on; ``UpdateHyper``: what it computes; ``UpdateEngine``: how it runs).

    advantages: (B, T) with T = the longest completion; zero on padding. The old log-probs are
    the policy's own before the first step (so the first minibatch step has ratio 1), under the
    sampling distribution of ``forward``. ``sampler_logprobs`` (B, T), the log-probs the sampler
    recorded, feed the sampler/trainer mismatch metrics (``sampler_kl`` and ``mismatch``,
    ``mismatch.py``, tokens past ``sampler_cap`` counted) and, with ``sampler_correction``,
    importance weights on the policy-gradient term (``loss.sampler_correction_weights``).

    A minibatch is run ``forward.micro_batch_size`` rows at a time with gradients accumulated; its
    loss is normalised by the whole minibatch's ``loss_normalizer``, so the step equals that of one
    pass over the minibatch. A minibatch whose loss or gradient norm is not finite changes nothing
    (no optimizer or scheduler step); ``skipped`` and ``trailing_skipped`` count them so the caller
    can stop a run that diverged. ``reference_forward`` runs the reference model (default:
    ``forward``; a reference held in the low dtype needs no autocast).

    With ``parallel`` (world size W > 1) ``model`` is the data-parallel root (``distributed.py``):
    each rank runs its share of every minibatch, all ranks in the same order, and every loss is
    normalised by the whole minibatch's count; the statistics returned are those of all ranks.

    ``clock`` (``steptime.StepClock``) times the old and reference log-prob passes apart.

    ``old_from_sampler``: take ``sampler_logprobs`` as the old log-probs instead of running the
    pre-update pass, for a sampler that is the trained model in the same precision (the HF backend
    in fp32: the two differ by float rounding, docs/studies/throughput.md). The entropy is then measured in
    the first pass's forwards and ``sampler_kl`` is NaN (nothing to compare); the ``mismatch``
    statistics come from the forwards of the minibatches before the first optimizer step (still
    the weights that sampled), summed over their micro-batches and the ranks."""
    B = len(batch.completion_ids)
    forward, parallel, reference = engine.forward, engine.parallel, engine.reference
    stepper = engine.stepper or GradientStepper(Precision("fp32", torch.float32, None))
    rows = forward.rows_per_pass(hyper.minibatch_size)
    params = [p for p in model.parameters() if p.requires_grad]
    plan_minibatches = functools.partial(
        minibatch_rows, B, hyper.minibatch_size, engine.generator, group_ids=batch.group_ids,
        row_signs=advantage_signs(batch.advantages) if hyper.reward_balanced else None,
        query_preserved=hyper.query_preserved, reward_balanced=hyper.reward_balanced)
    if carries_no_signal(batch.advantages, reference, hyper.kl_coef):
        return _steps_without_signal(model, optimizer, scheduler, params, stepper, hyper.updates_per_batch,
                                     plan_minibatches, hyper.grad_clip)
    model.eval()
    ids = (batch.prompt_ids, batch.completion_ids, batch.pad_id)
    sampler_logprobs = batch.sampler_logprobs
    if hyper.old_from_sampler:
        if sampler_logprobs is None or hyper.sampler_correction != "none":
            raise ValueError("old_from_sampler needs sampler_logprobs and no sampler_correction")
        (old_logprobs, mask), entropies = _sampler_as_old(sampler_logprobs, batch.completion_ids), None
    else:
        with phase(engine.clock, "old_logprobs"):
            old_logprobs, mask, entropies = chunked_completion_logprobs(model, *ids, rows, forward, parallel)
    ref_logprobs = None
    if reference is not None and hyper.kl_coef != 0.0:
        with phase(engine.clock, "ref_logprobs"):
            ref_logprobs, _, _ = chunked_completion_logprobs(reference, *ids, rows,
                                                             engine.reference_forward or forward, parallel)
    entropy = float((entropies * mask).sum() / mask.sum().clamp(min=1)) if entropies is not None else float("nan")
    sampler_kl = float("nan")
    mismatch = MismatchStats()
    weights = None
    if sampler_logprobs is not None and not hyper.old_from_sampler:
        sampler_logprobs = sampler_logprobs[:, : mask.shape[1]]
        sampler_kl = float(((sampler_logprobs - old_logprobs) * mask).sum() / mask.sum().clamp(min=1))
        mismatch = mismatch_stats(old_logprobs, sampler_logprobs, mask, hyper.sampler_cap)
        if hyper.sampler_correction != "none":
            weights = sampler_correction_weights(old_logprobs, sampler_logprobs, mask, hyper.sampler_correction,
                                                 hyper.sampler_cap)

    model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl_ref": 0.0, "approx_kl_old": 0.0, "grad_norm": 0.0}
    steps = skipped = trailing = overflows = 0
    entropy_sums = [0.0, 0.0]  # the first pass's entropy x tokens and tokens, without a pre-pass
    first_forwards = MismatchSums()  # the mismatch in the forwards before the first step, without one
    for epoch in range(hyper.updates_per_batch):
        for idx in plan_minibatches():
            # The whole minibatch's count, shared by the ranks; times W because DDP and FSDP2
            # average the ranks' gradients where the minibatch loss needs their sum.
            normalizer = loss_normalizer(mask[idx], hyper.loss_agg, hyper.max_tokens) / parallel.world_size
            optimizer.zero_grad(set_to_none=True)
            minibatch = _accumulate_minibatch(
                model, forward, stepper, parallel, idx, rows, *ids, old_logprobs, batch.advantages, ref_logprobs,
                weights, normalizer, clip_low=hyper.clip_low, clip_high=hyper.clip_high, loss_agg=hyper.loss_agg,
                max_tokens=hyper.max_tokens, kl_coef=hyper.kl_coef, kl_estimator=hyper.kl_estimator,
                kl_clamp=hyper.kl_clamp, clip_ratio_c=hyper.clip_ratio_c, token_selection=hyper.token_selection,
                entropy_sums=entropy_sums if entropies is None and epoch == 0 else None,
                mismatch_into=first_forwards if hyper.old_from_sampler and epoch == 0 and steps == 0 else None,
                mismatch_cap=hyper.sampler_cap)
            if minibatch is None:
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                trailing += 1
                continue
            result = stepper.step(optimizer, params, hyper.grad_clip)
            if not result.stepped:
                # A finite loss can still have an inf/NaN gradient; one such step would poison the
                # weights and the optimizer moments for good, so it is skipped like a NaN loss
                # (fp16 overflows are the loss scaler's business: skipped, counted apart).
                optimizer.zero_grad(set_to_none=True)
                if result.overflow:
                    overflows += 1
                else:
                    skipped += 1
                    trailing += 1
                continue
            scheduler.step()
            steps += 1
            trailing = 0
            for key in ("loss", "clip_fraction", "kl_ref", "approx_kl_old"):
                totals[key] += minibatch[key]
            totals["grad_norm"] += result.grad_norm
    # Gradients are not needed until the next update: free them now rather than carrying 4 bytes
    # per trained weight through sampling and the next pre-pass (docs/studies/memory.md, finding 1).
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    if entropies is None and entropy_sums[1]:
        entropy = entropy_sums[0] / entropy_sums[1]
    if hyper.old_from_sampler:
        mismatch = first_forwards.stats()
    # With every step skipped there is no loss to report: NaN says so in the metrics.
    mean = {k: v / steps if steps else float("nan") for k, v in totals.items()}
    return UpdateStats(entropy=entropy, lr=scheduler.get_last_lr()[0], skipped=skipped, updates=steps,
                       trailing_skipped=trailing, sampler_kl=sampler_kl, overflow_skipped=overflows,
                       mismatch=mismatch, **mean)


def carries_no_signal(advantages: torch.Tensor, reference, kl_coef: float) -> bool:
    """True when the loss is zero whatever the weights: every advantage is exactly 0 (e.g. a batch
    whose rewards are all equal under GRPO) and no KL term pulls towards a reference. The gradient
    of every minibatch is then exactly 0. Every rank holds the whole batch's advantages, so all
    ranks decide alike without a collective."""
    return (reference is None or kl_coef == 0.0) and not bool(advantages.any())


def _steps_without_signal(model, optimizer, scheduler, params, stepper, updates_per_batch: int,
                          plan_minibatches: Callable[[], list[list[int]]], grad_clip: float) -> UpdateStats:
    """The optimizer steps of an update whose gradients are all exactly 0, without the forward and
    backward passes that would compute them (on SmolLM2-135M, 177 s of a 243 s GSM8K step).

    The steps are still taken, with zero gradients, and the minibatch order is still drawn: AdamW
    moves the weights on its momentum and decays them even at a zero gradient, the scheduler
    advances, and the minibatch shuffler (``plan_minibatches`` draws from it) stays where the full
    update would leave it, so the weights and every
    later step equal those of running the passes, bit for bit. What the passes would only have
    measured (entropy, clip fraction, KL to the old policy, sampler mismatch: ``sampler_kl`` and
    the ``mismatch`` statistics, 0 tokens) is NaN for the step;
    the loss and gradient norm are the 0 they would have been."""
    model.train()
    steps = overflows = 0
    for _ in range(updates_per_batch):
        for _ in plan_minibatches():
            optimizer.zero_grad(set_to_none=True)
            for p in params:
                p.grad = torch.zeros_like(p)
            result = stepper.step(optimizer, params, grad_clip)
            if result.overflow:
                overflows += 1
                continue
            scheduler.step()
            steps += 1
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    nan = float("nan")
    return UpdateStats(loss=0.0, clip_fraction=nan, kl_ref=0.0, approx_kl_old=nan, entropy=nan, grad_norm=0.0,
                       lr=scheduler.get_last_lr()[0], skipped=0, updates=steps, trailing_skipped=0,
                       overflow_skipped=overflows)


def _sampler_as_old(sampler_logprobs: torch.Tensor, completion_ids: list[list[int]]):
    """(B, T) old log-probs (float32, CPU) and completion mask from the sampler's record."""
    T = max((len(c) for c in completion_ids), default=0)
    lengths = torch.tensor([len(c) for c in completion_ids])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = torch.zeros(len(completion_ids), T)
    old[:, : min(T, sampler_logprobs.shape[1])] = sampler_logprobs[:, :T].float().cpu()
    return old * mask, mask


def _accumulate_minibatch(model, forward, stepper, parallel, idx, rows, prompt_ids, completion_ids, pad_id,
                          old_logprobs, advantages, ref_logprobs, weights, normalizer, entropy_sums=None,
                          mismatch_into: MismatchSums | None = None, mismatch_cap: float = 2.0,
                          token_selection=None, **loss_kwargs) -> dict | None:
    """Forward and backward over this rank's share of the minibatch ``idx`` in micro-batches of
    ``rows``, gradients accumulated in the parameters (and synchronised over ranks in the last
    one). Returns the minibatch's loss and token-weighted statistics over all ranks, or None
    (gradients undefined) when any micro-batch's loss on any rank was not finite. With
    ``entropy_sums`` (a list [entropy x tokens, tokens]) the forwards also add the entropy of
    every token of the minibatch, over all ranks, to it. With ``mismatch_into`` (a
    ``MismatchSums``; ``old_logprobs`` are then the sampler's) the forwards' log-probs are
    compared with ``old_logprobs`` and the minibatch's sums, over all ranks, added to it
    (``mismatch_cap``: the ratio counted as past the cap). With ``token_selection`` the forwards
    compute each token's entropy and the selection's 0/1 weights of each micro-batch multiply its
    policy-gradient term (``UpdateHyper.token_selection``)."""
    shares = [micro_batches(share, prompt_ids, completion_ids, rows, forward.micro_batch_tokens)
              for share in split_evenly(idx, parallel.world_size)]
    mine = shares[parallel.rank]
    passes = max(len(share) for share in shares)  # every rank makes as many passes
    # loss, clip_fraction, kl_ref and approx_kl_old (token-weighted), tokens, non-finite losses
    sums = [0.0] * 8  # ... and the entropy x tokens and tokens for entropy_sums
    mismatch = MismatchSums()  # this rank's share, with mismatch_into
    for k in range(passes):
        micro = mine[k] if k < len(mine) else []
        weight = 1.0 if micro else 0.0  # a rank out of rows takes part with a zero-weighted pass
        micro = micro or idx[:1]
        with parallel.accumulating(model, last=k == passes - 1):
            logprobs, mb_mask, entropies = forward.logprobs(
                model, [prompt_ids[i] for i in micro], [completion_ids[i] for i in micro], pad_id,
                with_entropy=entropy_sums is not None or token_selection is not None)
            T = logprobs.shape[1]  # the micro-batch's longest completion

            def on_device(x: torch.Tensor | None) -> torch.Tensor | None:
                return None if x is None else x[micro, :T].to(logprobs.device)

            selected = None if token_selection is None else token_selection(entropies.detach(), mb_mask)
            loss, stats = policy_loss(
                logprobs, on_device(old_logprobs), on_device(advantages), mb_mask,
                ref_logprobs=on_device(ref_logprobs), sampler_weights=on_device(weights), normalizer=normalizer,
                token_weights=selected, **loss_kwargs,
            )
            finite = bool(torch.isfinite(loss))
            # A non-finite loss is still backpropagated (the other ranks' backward waits for this
            # one); the step is skipped below, so what it leaves in the gradients is discarded.
            stepper.backward(loss * weight)
        if not weight:
            continue
        n = int(mb_mask.sum())
        if entropy_sums is not None:
            sums[6] += float((entropies * mb_mask).sum())
            sums[7] += n
        if mismatch_into is not None:
            mismatch.add(mismatch_sums(logprobs, on_device(old_logprobs), mb_mask, mismatch_cap))
        sums[0] += float(loss.detach())  # already a share of the minibatch loss
        sums[1] += stats.clip_fraction * n
        sums[2] += stats.kl_ref * n
        sums[3] += stats.approx_kl_old * n
        sums[4] += n
        sums[5] += not finite
    loss_sum, clip, kl_ref, approx_kl, tokens, nonfinite, entropy_sum, entropy_tokens = parallel.sum(sums)
    if entropy_sums is not None:
        entropy_sums[0] += entropy_sum
        entropy_sums[1] += entropy_tokens
    if mismatch_into is not None:
        mismatch_into.add(mismatch.over_ranks(parallel))
    if nonfinite:
        return None
    tokens = max(1.0, tokens)
    # Each rank's loss was scaled by W (see the normaliser): the sum over ranks is W x the loss.
    return {"loss": loss_sum / parallel.world_size, "clip_fraction": clip / tokens, "kl_ref": kl_ref / tokens,
            "approx_kl_old": approx_kl / tokens}
