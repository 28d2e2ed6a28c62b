"""One policy update on a sampled batch: old log-probs, then several clipped-ratio minibatch steps.

Kept apart from the training stage so the stage reads as sample -> segment -> attribute ->
update, and so tests can drive an update on hand-made tensors. How the model is run (the
sampling distribution the log-probs are taken under, autocast, chunked LM head, micro-batches)
is one ``ForwardPass`` (``policy/logprobs.py``, where every completion is scored); how a
gradient becomes a step (loss scaling, clipping, skipping non-finite steps) is a
``precision.GradientStepper``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from rredcot_cli.train.batching import advantage_signs, minibatch_rows
from rredcot_cli.train.distributed import DataParallel
from rredcot_cli.policy.logprobs import ForwardPass, chunked_completion_logprobs, micro_batches
from rredcot_cli.train.loss import LossSettings, LossStats, loss_normalizer, policy_loss, sampler_correction_weights
from rredcot_cli.train.mismatch import MismatchStats, MismatchSums, mismatch_stats, mismatch_sums
from rredcot_cli.train.precision import GradientStepper, Precision, StepResult
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

    def token_ids(self, rows: list[int] | None = None) -> tuple[list[list[int]], list[list[int]], int]:
        """The prompt and completion ids of ``rows`` (None: every row), and the pad id: a forward's
        arguments."""
        if rows is None:
            return self.prompt_ids, self.completion_ids, self.pad_id
        return [self.prompt_ids[i] for i in rows], [self.completion_ids[i] for i in rows], self.pad_id


@dataclass(frozen=True)
class UpdateHyper:
    """The ``train.*`` hyper-parameters of one policy update: what it computes.

    ``updates_per_batch`` passes over the batch in minibatches of ``minibatch_size`` rows; the
    ``loss`` each minibatch minimises (``loss.LossSettings``: clip range, aggregation, KL term,
    dual clip); ``grad_clip`` on the global gradient norm; ``sampler_correction`` (capped at
    ``sampler_cap``) on the policy-gradient term; ``old_from_sampler``: take the sampler's
    log-probs as the old ones instead of the pre-update pass (``old_from_sampler()``).
    ``query_preserved`` / ``reward_balanced``: how each pass cuts the batch into minibatches
    (``batching.minibatch_rows``; both off: shuffled rows). ``token_selection``: the credit
    method's choice of the tokens that carry the policy-gradient term, ``fn(entropies (B, T),
    mask (B, T)) -> (B, T)`` 0/1 weights computed from each forward of the update
    (``MethodSpec.loss_tokens``; e.g. ``methods/high_entropy.py``), or None (all)."""

    updates_per_batch: int
    minibatch_size: int
    loss: LossSettings
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

    def rows_per_pass(self, hyper: UpdateHyper) -> int:
        """Rows per forward: a minibatch's, unless ``forward.micro_batch_size`` cuts it smaller."""
        return self.forward.rows_per_pass(hyper.minibatch_size)


@dataclass(frozen=True)
class Stepping:
    """What turns a minibatch's accumulated gradients into an optimizer step: the ``optimizer``
    over the trainable ``params``, its ``scheduler``, the ``stepper`` (loss scaling, clipping at
    ``grad_clip``, refusing non-finite gradients)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    params: list[torch.nn.Parameter]
    stepper: GradientStepper
    grad_clip: float

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> StepResult:
        """The optimizer step (and the scheduler's) where the gradient allows one."""
        result = self.stepper.step(self.optimizer, self.params, self.grad_clip)
        if result.stepped:
            self.scheduler.step()
        return result


@dataclass(frozen=True)
class PrePass:
    """What every minibatch of an update compares against, fixed before its first step: the
    (B, T) ``old_logprobs`` (float32, CPU) and completion ``mask``, the reference's
    ``ref_logprobs`` (None without a KL term) and the ``sampler_weights`` of the sampler
    correction (None without one). What the pass measured: the mean ``entropy`` (None where the
    sampler's log-probs stood in for the pass: the first minibatches measure it then), the
    ``sampler_kl`` and ``mismatch`` against the sampler's log-probs (NaN without them)."""

    old_logprobs: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    sampler_weights: torch.Tensor | None = None
    entropy: float | None = None
    sampler_kl: float = float("nan")
    mismatch: MismatchStats = field(default_factory=MismatchStats)


@dataclass
class MinibatchSums:
    """One minibatch's statistics as sums over its micro-batches (``add``), then over the ranks
    (``over_ranks``), before ``metrics`` divides: token-weighted, so every token of the minibatch
    counts once whichever rank and pass it fell in."""

    loss: float = 0.0  # the passes' losses, each already its share of the minibatch loss
    clip: float = 0.0  # clip fraction x tokens
    kl_ref: float = 0.0  # KL to the reference x tokens
    approx_kl_old: float = 0.0  # approximate KL to the old policy x tokens
    tokens: float = 0.0
    nonfinite: float = 0.0  # passes whose loss was not finite
    entropy: float = 0.0  # entropy x tokens, where the passes measure it
    entropy_tokens: float = 0.0

    def add(self, loss: torch.Tensor, stats: LossStats, tokens: int) -> None:
        self.loss += float(loss.detach())
        self.clip += stats.clip_fraction * tokens
        self.kl_ref += stats.kl_ref * tokens
        self.approx_kl_old += stats.approx_kl_old * tokens
        self.tokens += tokens
        self.nonfinite += not bool(torch.isfinite(loss))

    def add_entropy(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        self.entropy += float((entropies * mask).sum())
        self.entropy_tokens += int(mask.sum())

    def over_ranks(self, parallel: DataParallel) -> "MinibatchSums":
        """The sums of every rank (one all-reduce); every rank gets the same."""
        return MinibatchSums(*parallel.sum([getattr(self, f.name) for f in fields(self)]))

    def metrics(self, world_size: int) -> dict | None:
        """The minibatch's loss and token means, or None where any pass's loss was not finite."""
        if self.nonfinite:
            return None
        tokens = max(1.0, self.tokens)
        # Each rank's loss was scaled by W (see the normaliser): the sum over ranks is W x the loss.
        return {"loss": self.loss / world_size, "clip_fraction": self.clip / tokens, "kl_ref": self.kl_ref / tokens,
                "approx_kl_old": self.approx_kl_old / tokens}


@dataclass(frozen=True)
class Measuring:
    """What a minibatch's forwards measure besides the loss: the ``entropy`` (without a
    pre-update pass, in the first pass over the batch) and the sampler ``mismatch`` (with the
    sampler's log-probs as the old ones, before the first optimizer step)."""

    entropy: bool = False
    mismatch: bool = False


@dataclass
class UpdateTally:
    """Running sums over an update's minibatch steps: the metrics of the steps taken, the counts
    of those skipped, and what the first forwards measured (``Measuring``)."""

    totals: dict = field(default_factory=lambda: dict.fromkeys(
        ("loss", "clip_fraction", "kl_ref", "approx_kl_old", "grad_norm"), 0.0))
    steps: int = 0
    skipped: int = 0
    trailing: int = 0  # skipped steps since the last one taken
    overflows: int = 0
    entropy: float = 0.0  # entropy x tokens of the first pass, without a pre-update pass
    entropy_tokens: float = 0.0
    first_forwards: MismatchSums = field(default_factory=MismatchSums)  # before the first step

    def measured(self, sums: MinibatchSums, mismatch: MismatchSums, measuring: Measuring) -> None:
        if measuring.entropy:
            self.entropy += sums.entropy
            self.entropy_tokens += sums.entropy_tokens
        if measuring.mismatch:
            self.first_forwards.add(mismatch)

    def took(self, minibatch: dict, grad_norm: float) -> None:
        self.steps += 1
        self.trailing = 0
        for key in ("loss", "clip_fraction", "kl_ref", "approx_kl_old"):
            self.totals[key] += minibatch[key]
        self.totals["grad_norm"] += grad_norm

    def skip(self) -> None:
        self.skipped += 1
        self.trailing += 1

    def stats(self, pre: PrePass, hyper: UpdateHyper, lr: float) -> UpdateStats:
        if self.entropy_tokens:
            entropy = self.entropy / self.entropy_tokens
        else:
            entropy = pre.entropy if pre.entropy is not None else float("nan")
        mismatch = self.first_forwards.stats() if hyper.old_from_sampler else pre.mismatch
        # With every step skipped there is no loss to report: NaN says so in the metrics.
        mean = {k: v / self.steps if self.steps else float("nan") for k, v in self.totals.items()}
        return UpdateStats(entropy=entropy, lr=lr, skipped=self.skipped, updates=self.steps,
                           trailing_skipped=self.trailing, sampler_kl=pre.sampler_kl, overflow_skipped=self.overflows,
                           mismatch=mismatch, **mean)


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: UpdateBatch,
    hyper: UpdateHyper,
    engine: UpdateEngine,
) -> UpdateStats:
    """``hyper.updates_per_batch`` passes over ``batch`` in shuffled minibatches (``UpdateBatch``:
    what it trains on; ``UpdateHyper``: what it computes; ``UpdateEngine``: how it runs), in
    four phases: the old/reference pass (``pre_update_pass``), the minibatch plan
    (``minibatch_plan``), each minibatch's gradients accumulated (``accumulate_minibatch``) and
    its step (``minibatch_steps``).

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
    stepping = Stepping(optimizer, scheduler, [p for p in model.parameters() if p.requires_grad],
                        engine.stepper or GradientStepper(Precision("fp32", torch.float32, None)), hyper.grad_clip)
    plan = minibatch_plan(batch, hyper, engine.generator)
    if carries_no_signal(batch.advantages, engine.reference, hyper.loss.kl_coef):
        return _steps_without_signal(model, stepping, hyper.updates_per_batch, plan)
    model.eval()
    pre = pre_update_pass(model, batch, hyper, engine)
    model.train()
    tally = minibatch_steps(model, stepping, batch, pre, hyper, engine, plan)
    # Gradients are not needed until the next update: free them now rather than carrying 4 bytes
    # per trained weight through sampling and the next pre-pass (docs/studies/memory.md, finding 1).
    stepping.zero_grad()
    model.eval()
    return tally.stats(pre, hyper, scheduler.get_last_lr()[0])


def minibatch_plan(batch: UpdateBatch, hyper: UpdateHyper, generator: torch.Generator) -> Callable[[], list[list[int]]]:
    """A function that draws one pass's minibatches (rows of ``batch``) from ``generator``."""
    return functools.partial(
        minibatch_rows, len(batch.completion_ids), hyper.minibatch_size, generator, group_ids=batch.group_ids,
        row_signs=advantage_signs(batch.advantages) if hyper.reward_balanced else None,
        query_preserved=hyper.query_preserved, reward_balanced=hyper.reward_balanced)


def carries_no_signal(advantages: torch.Tensor, reference, kl_coef: float) -> bool:
    """True when the loss is zero whatever the weights: every advantage is exactly 0 (e.g. a batch
    whose rewards are all equal under GRPO) and no KL term pulls towards a reference. The gradient
    of every minibatch is then exactly 0. Every rank holds the whole batch's advantages, so all
    ranks decide alike without a collective."""
    return (reference is None or kl_coef == 0.0) and not bool(advantages.any())


def _steps_without_signal(model, stepping: Stepping, updates_per_batch: int,
                          plan: Callable[[], list[list[int]]]) -> UpdateStats:
    """The optimizer steps of an update whose gradients are all exactly 0, without the forward and
    backward passes that would compute them (on SmolLM2-135M, 177 s of a 243 s GSM8K step).

    The steps are still taken, with zero gradients, and the minibatch order is still drawn: AdamW
    moves the weights on its momentum and decays them even at a zero gradient, the scheduler
    advances, and the minibatch shuffler (``plan`` draws from it) stays where the full update
    would leave it, so the weights and every later step equal those of running the passes, bit
    for bit. What the passes would only have measured (entropy, clip fraction, KL to the old
    policy, sampler mismatch: ``sampler_kl`` and the ``mismatch`` statistics, 0 tokens) is NaN for
    the step; the loss and gradient norm are the 0 they would have been."""
    model.train()
    steps = overflows = 0
    for _ in range(updates_per_batch):
        for _ in plan():
            stepping.zero_grad()
            for p in stepping.params:
                p.grad = torch.zeros_like(p)
            # A zero gradient is finite: only an fp16 loss-scale overflow can refuse the step.
            if stepping.step().overflow:
                overflows += 1
                continue
            steps += 1
    stepping.zero_grad()
    model.eval()
    nan = float("nan")
    return UpdateStats(loss=0.0, clip_fraction=nan, kl_ref=0.0, approx_kl_old=nan, entropy=nan, grad_norm=0.0,
                       lr=stepping.scheduler.get_last_lr()[0], skipped=0, updates=steps, trailing_skipped=0,
                       overflow_skipped=overflows)


# ----------------------------------------------------------------- phase 1: the pre-update pass

def pre_update_pass(model, batch: UpdateBatch, hyper: UpdateHyper, engine: UpdateEngine) -> PrePass:
    """The old log-probs (the pre-update pass, or the sampler's), the reference's, and what they
    say against the sampler's log-probs: fixed for every minibatch of the update."""
    old_logprobs, mask, entropies = _old_logprobs(model, batch, hyper, engine)
    ref_logprobs = None
    if engine.reference is not None and hyper.loss.kl_coef != 0.0:
        with phase(engine.clock, "ref_logprobs"):
            ref_logprobs, _, _ = chunked_completion_logprobs(
                engine.reference, *batch.token_ids(), engine.rows_per_pass(hyper),
                engine.reference_forward or engine.forward, engine.parallel)
    pre = PrePass(old_logprobs, mask, ref_logprobs)
    if entropies is not None:
        pre = replace(pre, entropy=float((entropies * mask).sum() / mask.sum().clamp(min=1)))
    if batch.sampler_logprobs is None or hyper.old_from_sampler:
        return pre
    sampler_logprobs = batch.sampler_logprobs[:, : mask.shape[1]]
    weights = None
    if hyper.sampler_correction != "none":
        weights = sampler_correction_weights(old_logprobs, sampler_logprobs, mask, hyper.sampler_correction,
                                             hyper.sampler_cap)
    return replace(pre, sampler_weights=weights,
                   sampler_kl=float(((sampler_logprobs - old_logprobs) * mask).sum() / mask.sum().clamp(min=1)),
                   mismatch=mismatch_stats(old_logprobs, sampler_logprobs, mask, hyper.sampler_cap))


def _old_logprobs(model, batch: UpdateBatch, hyper: UpdateHyper, engine: UpdateEngine):
    """(B, T) old log-probs, completion mask and entropies (None when the sampler's log-probs
    stand in for the pass: ``old_from_sampler``)."""
    if hyper.old_from_sampler:
        if batch.sampler_logprobs is None or hyper.sampler_correction != "none":
            raise ValueError("old_from_sampler needs sampler_logprobs and no sampler_correction")
        return *_sampler_as_old(batch.sampler_logprobs, batch.completion_ids), None
    with phase(engine.clock, "old_logprobs"):
        return chunked_completion_logprobs(model, *batch.token_ids(),
                                           engine.rows_per_pass(hyper), engine.forward, engine.parallel)


def _sampler_as_old(sampler_logprobs: torch.Tensor, completion_ids: list[list[int]]):
    """(B, T) old log-probs (float32, CPU) and completion mask from the sampler's record."""
    T = max((len(c) for c in completion_ids), default=0)
    lengths = torch.tensor([len(c) for c in completion_ids])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = torch.zeros(len(completion_ids), T)
    old[:, : min(T, sampler_logprobs.shape[1])] = sampler_logprobs[:, :T].float().cpu()
    return old * mask, mask


# ----------------------------------------------------------------- phases 2-4: the minibatch steps

def minibatch_steps(model, stepping: Stepping, batch: UpdateBatch, pre: PrePass, hyper: UpdateHyper,
                    engine: UpdateEngine, plan: Callable[[], list[list[int]]]) -> UpdateTally:
    """``hyper.updates_per_batch`` passes over the minibatches ``plan`` draws: each one's gradients
    accumulated, then one step unless its loss or gradient is not finite."""
    tally = UpdateTally()
    for epoch in range(hyper.updates_per_batch):
        for idx in plan():
            measuring = Measuring(entropy=pre.entropy is None and epoch == 0,
                                  mismatch=hyper.old_from_sampler and epoch == 0 and tally.steps == 0)
            stepping.zero_grad()
            sums, mismatch = accumulate_minibatch(model, stepping.stepper, idx, batch, pre, hyper, engine, measuring)
            tally.measured(sums, mismatch, measuring)
            minibatch = sums.metrics(engine.parallel.world_size)
            if minibatch is None:
                stepping.zero_grad()
                tally.skip()
                continue
            result = stepping.step()
            if not result.stepped:
                # A finite loss can still have an inf/NaN gradient; one such step would poison the
                # weights and the optimizer moments for good, so it is skipped like a NaN loss
                # (fp16 overflows are the loss scaler's business: skipped, counted apart).
                stepping.zero_grad()
                if result.overflow:
                    tally.overflows += 1
                else:
                    tally.skip()
                continue
            tally.took(minibatch, result.grad_norm)
    return tally


def accumulate_minibatch(model, stepper: GradientStepper, idx: list[int], batch: UpdateBatch, pre: PrePass,
                         hyper: UpdateHyper, engine: UpdateEngine,
                         measuring: Measuring = Measuring()) -> tuple[MinibatchSums, MismatchSums]:
    """Forward and backward over this rank's passes of the minibatch ``idx``
    (``DataParallel.micro_passes``), gradients accumulated in the parameters (and synchronised
    over ranks in the last pass). Returns the minibatch's statistics over all ranks (their
    ``metrics`` are None, and the gradients undefined, when any pass's loss on any rank was not
    finite) and, with ``measuring.mismatch`` (the old log-probs are then the sampler's), the
    forwards' sampler mismatch over all ranks. With ``hyper.token_selection`` the forwards compute
    each token's entropy and the selection's 0/1 weights multiply the policy-gradient term."""
    forward, parallel = engine.forward, engine.parallel
    # The whole minibatch's count, shared by the ranks; divided by W because DDP and FSDP2
    # average the ranks' gradients where the minibatch loss needs their sum.
    normalizer = loss_normalizer(pre.mask[idx], hyper.loss.loss_agg, hyper.loss.max_tokens) / parallel.world_size
    passes = parallel.micro_passes(idx, lambda share: micro_batches(
        share, batch.prompt_ids, batch.completion_ids, engine.rows_per_pass(hyper), forward.micro_batch_tokens))
    with_entropy = measuring.entropy or hyper.token_selection is not None
    sums, mismatch = MinibatchSums(), MismatchSums()
    for k, micro in enumerate(passes):
        weight = 1.0 if micro else 0.0  # a rank out of rows takes part with a zero-weighted pass
        micro = micro or idx[:1]
        with parallel.accumulating(model, last=k == len(passes) - 1):
            logprobs, mask, entropies = forward.logprobs(model, *batch.token_ids(micro), with_entropy=with_entropy)

            def on_device(x: torch.Tensor | None) -> torch.Tensor | None:
                return None if x is None else x[micro, : logprobs.shape[1]].to(logprobs.device)

            selected = None if hyper.token_selection is None else hyper.token_selection(entropies.detach(), mask)
            loss, stats = policy_loss(logprobs, on_device(pre.old_logprobs), on_device(batch.advantages), mask,
                                      hyper.loss, ref_logprobs=on_device(pre.ref_logprobs),
                                      sampler_weights=on_device(pre.sampler_weights), token_weights=selected,
                                      normalizer=normalizer)
            # A non-finite loss is still backpropagated (the other ranks' backward waits for this
            # one); the step is skipped, so what it leaves in the gradients is discarded.
            stepper.backward(loss * weight)
        if not weight:
            continue
        sums.add(loss, stats, int(mask.sum()))
        if measuring.entropy:
            sums.add_entropy(entropies, mask)
        if measuring.mismatch:
            mismatch.add(mismatch_sums(logprobs, on_device(pre.old_logprobs), mask, hyper.sampler_cap))
    return sums.over_ranks(parallel), (mismatch.over_ranks(parallel) if measuring.mismatch else mismatch)
