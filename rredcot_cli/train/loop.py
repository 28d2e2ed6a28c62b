"""The RL loop of ``rredcot train``: group sampling, segment-level credit, clipped policy gradient.

The algorithm, one step (``Trainer.step``):

1. **Sampling.** The next ``train.prompts_per_step`` training problems, ``sampling.n`` completions
   each (a group per prompt), verified into rewards. Seeds come from (seed, step), so a resumed
   step samples what an uninterrupted one does. With ``train.dynamic_sampling`` (DAPO, Yu et al.
   2025) groups whose rewards are all equal are dropped and more problems drawn, up to
   ``train.max_sampling_rounds`` draws.
2. **Credit.** Each completion is cut into segments (``segment.*``) and the credit method
   (``method.*``, one pure function in ``rredcot_cli/methods/``) turns rewards, segments and, for
   model-based methods, the policy's own scores into per-token advantages A[i, t]. The loop never
   looks at which method it runs: capability flags (``needs``, ``batch_wide``) say what to give it.
3. **Update.** ``train.updates_per_batch`` passes over the batch in shuffled minibatches of the
   clipped-ratio surrogate, ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)`` with
   ``r = pi(y_t) / pi_old(y_t)`` (``loss.policy_loss``), plus ``train.kl_coef`` x KL to the initial
   policy (``update.policy_update``).
4. **Refresh.** The new weights go to the sampler (and to the other ranks' copies); a method with a
   learned critic (ppo) has it fitted to the method's value targets.
5. **Record.** One metrics row (``Trainer.record``), written by rank 0 to ``metrics.parquet`` and
   the trackers after every step (the sampler/trainer mismatch in its ``mismatch_*`` columns,
   ``rredcot_cli/train/mismatch.py``); every ``train.eval_every`` steps a held-out eval, every
   ``train.save_every`` steps a resumable checkpoint (``rredcot_cli/train/checkpoint.py``).

Launch it in one process, with torchrun (DDP or FSDP2, rredcot_cli/train/distributed.py), or on Slurm
(scripts/slurm/train.sbatch runs one torchrun per node):

    rredcot train experiment=quick method=rredcot run.dir=runs/quick
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m rredcot_cli train \\
        method=rredcot train.steps=3 backend.batch_size=32 run.dir=runs/ddp2
    torchrun --standalone --nproc-per-node=8 -m rredcot_cli train experiment=gsm8k_qwen method=rredcot \\
        backend=hf train.parallel=fsdp2 run.dir=runs/gsm8k-rredcot
    RUN_DIR=/shared/runs/x sbatch --nodes=4 scripts/slurm/train.sbatch experiment=gsm8k_qwen backend=hf

The trained weights have two names: ``trained``, what the update runs (under torchrun the DDP or
FSDP2 root), and ``plain``, the model that samples, scores and is saved (the same object in one
process). Each phase of a step runs under the step clock (``self.clock.phase(...)``, the
``seconds_<phase>`` columns); ``steptime.PHASE_OBSERVERS`` lets a bench watch the phases open and
close without touching this module (``bench/scaling.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from rredcot_cli.console import console, progress_bar
from rredcot_cli.rng import derive_seed
from rredcot_cli.store import metrics_log, runs, train_rollouts
from rredcot_cli.train import distributed, memory, mismatch, steptime, tracking, checkpoint, trainable, preemption
from rredcot_cli.errors import TrainingError
from rredcot_cli.methods.base import Credit
from rredcot_cli.train.precision import GradientStepper, Precision, dtype_of, make_optimizer
from rredcot_cli.pipeline import (attribute, completion_entropies, credit_batch, credit_rows, evaluate,
                                  prompts_per_call, sample_rows, segment_rows)
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.train.checkpoint import TrainState
from rredcot_cli.train.critic import build_critic
from rredcot_cli.train.update import (UpdateBatch, UpdateEngine, UpdateHyper, UpdateStats, auto_micro_batch_tokens,
                                      lr_lambda, policy_update)
from rredcot_cli.policy.logprobs import ForwardPass

if TYPE_CHECKING:
    from rredcot_cli.config.schema import CriticConfig, SamplingConfig, SegmentConfig, TrainConfig

# A step without an update (dynamic sampling found no mixed group): nothing taken, nothing skipped.
_NO_UPDATE = UpdateStats(loss=float("nan"), clip_fraction=float("nan"), kl_ref=float("nan"),
                         approx_kl_old=float("nan"), entropy=float("nan"), grad_norm=float("nan"), lr=float("nan"),
                         skipped=0, updates=0, trailing_skipped=0)


@dataclass
class TrainSettings:
    """What the loop reads from the config, typed: the stage (stages/train.py) builds it from the
    composed config, so nothing below takes the config itself."""

    seed: int
    train: TrainConfig  # train.*
    sampling: SamplingConfig  # sampling.*
    critic: CriticConfig  # critic.*: read only for a method that needs a critic
    train_split: str  # benchmark.train_split
    eval_split: str  # benchmark.eval_split
    backend_batch_size: int  # backend.batch_size: completions per generate() call
    segment: SegmentConfig  # segment.*: the rule and its options
    lora: trainable.LoraSettings | None  # model.lora when model.lora.r > 0
    save_dtype: str  # model.dtype, the final checkpoint's
    tracked_config: dict  # the whole resolved config, as the trackers record it


@dataclass
class Learned:
    """What a step with an update learned from and measured: the segments, the credit batch
    (``pipeline.credit_batch``), the method's credit, the update's and the critic's statistics."""

    segments: list[dict]
    batch: Any
    credit: Credit
    stats: UpdateStats
    critic_stats: Any = None


@dataclass
class StepResult:
    """One finished step: its metrics ``row``, the tokens it generated, the samples it trained on
    and what it learned (None for a step without an update)."""

    row: dict
    tokens: int
    samples: list[dict]
    learned: Learned | None

    @property
    def stats(self) -> UpdateStats:
        return self.learned.stats if self.learned else _NO_UPDATE


@dataclass
class Fitted:
    """What a finished ``Trainer.fit`` hands to the stage: the final state, the held-out evals,
    the time spent (over every attempt), the final checkpoint and the step it resumed from."""

    state: TrainState
    eval_rows_after: list[dict]
    eval_after: dict
    seconds: float
    cpu_seconds: float
    checkpoint: Any
    resumed_from: int | None


class Trainer:
    """The training run of one ``rredcot train`` process, built once: the data, the policy and its
    forward pass, the credit method, the optimizer, the data-parallel group, the step clock and
    the recorder. ``fit()`` runs it; ``step(step)`` is one step of the algorithm."""

    def __init__(self, settings: TrainSettings, *, benchmark, policy, spec, params: dict,
                 out, parallel: distributed.DataParallel, precision: Precision, hyper: UpdateHyper,
                 trackers: list[str]):
        """``benchmark`` and ``policy`` come built (and the global RNGs seeded) by the stage;
        everything else the loop needs is built here, in this order, from them and ``settings``."""
        self.settings, self.t, self.s = settings, settings.train, settings.sampling
        self.spec, self.params, self.out, self.parallel, self.precision = spec, params, out, parallel, precision
        self.hyper, self.benchmark, self.policy = hyper, benchmark, policy
        self.checkpoints = out.dir / "checkpoints"
        self.config_hash = out.manifest["config_hash"]
        self.saved = self._resumable()
        self._load_data()
        self._build_policy()
        self._build_method()
        self._build_optimizer()
        self._check_sampling()
        self.clock = steptime.StepClock()  # seconds per phase of each step, in the metrics row
        self.engine = UpdateEngine(generator=self.generator, forward=self.forward, reference=self.reference,
                                   reference_forward=self.reference_forward, stepper=self.stepper,
                                   parallel=parallel, clock=self.clock)
        self.parts = checkpoint.Stateful(self.trained, self.policy.model, parallel, self.tokenizer, self.optimizer,
                                          self.scheduler, self.generator, self.critic, self.stepper)
        self.recorder = Recorder(out, trackers, settings.tracked_config, parallel.is_main, spec.name,
                                 self.t.save_rollouts)
        self.state = TrainState()

    # ------------------------------------------------------------------ setup, in the order it runs

    def _resumable(self) -> dict | None:
        """The checkpoint this run continues from: the latest of the unfinished attempt it continues
        (``runs.begin_stage``), or with ``train.resume=true`` of any; None: start at step 0, clearing
        what an earlier attempt left (replaced on purpose: begin_stage said so)."""
        look = self.out.continuing or self.t.resume is True
        saved = checkpoint.latest(self.checkpoints, self.config_hash) if look else None
        if self.t.resume is True and saved is None:
            console.print(f"train.resume=true: no resumable checkpoint in {self.checkpoints}; starting from step 0")
        elif look and saved is None:
            console.print(f"found an unfinished attempt in {self.out.dir} with no checkpoint yet (train.save_every="
                          f"{self.t.save_every}): starting from step 0")
        if saved is None and self.parallel.is_main:
            # they belong to the attempt this one replaces
            checkpoint.remove_all(self.checkpoints)
            shutil.rmtree(self.out.dir / train_rollouts.FOLDER, ignore_errors=True)
        self.parallel.barrier()
        return saved

    def _load_data(self) -> None:
        """The training problems (all the split when ``train.data_order_seed`` shuffles it, else as
        many as the run can draw) and the held-out ones."""
        settings, t = self.settings, self.t
        draws_per_step = t.max_sampling_rounds if t.dynamic_sampling else 1
        limit = None if t.data_order_seed is not None else t.steps * t.prompts_per_step * draws_per_step
        self.train_problems = self.benchmark.load(settings.train_split, limit=limit)
        self.eval_problems = self.benchmark.load(settings.eval_split, limit=t.eval_problems)
        if not self.train_problems:
            raise TrainingError(f"benchmark {self.benchmark.name}: split {settings.train_split!r} has no "
                                "problems to train on")

    def _build_policy(self) -> None:
        """The weights, one name per role: ``self.policy.model`` (the trained weights as they
        sample, score, sync and are saved), ``self.trained`` (the same weights wrapped for data
        parallelism, as the update runs them forward and backward) and ``self.reference`` (the
        frozen initial policy of the KL term; None without one); then the forward pass and the
        gradient stepper. ``self.policy`` becomes the loop's own ``Policy`` (the stage's backend,
        the prepared weights): the one the stage built is not changed."""
        t, s, precision, policy = self.t, self.s, self.precision, self.policy
        model_config = policy.model.config
        prepared = trainable.prepare(policy.model, precision, lora=self.settings.lora)
        self.tokenizer = policy.tokenizer
        self.autocast = functools.partial(precision.autocast, policy.device)
        sampled = s.temperature > 0  # greedy draws have no distribution: score them at temperature 1
        self.forward = ForwardPass(
            temperature=s.temperature if sampled else 1.0, top_p=s.top_p if sampled else 1.0,
            chunk_tokens=t.logprob_chunk_tokens, micro_batch_size=t.micro_batch_size, autocast=self.autocast,
            micro_batch_tokens=auto_micro_batch_tokens(t.micro_batch_tokens, policy.device, self.parallel.world_size))
        self.stepper = GradientStepper(precision, policy.device)
        if self._checkpointing(model_config, prepared):
            trainable.checkpoint_layers(prepared)
        # The initial policy (with no checkpointing: it is never trained), also when resuming.
        reference, self.reference_forward = (trainable.reference(prepared, precision, self.forward) if t.kl_coef
                                             else (None, None))
        self.trained, plain, self.reference = self.parallel.wrap(prepared, reference)
        # Methods score with the policy being trained (adapters included); FSDP2 shards the
        # prepared model in place, so there the policy samples from the full copy ``wrap`` made.
        self.policy = dataclasses.replace(policy, model=plain)
        if plain is not prepared:
            self.policy.backend.sync_weights(plain)

    def _checkpointing(self, model_config, model: torch.nn.Module) -> bool:
        """Whether the update checkpoints its decoder layers (``train.gradient_checkpointing``;
        ``auto`` decides from the estimated saving, rredcot_cli/train/memory.py), and rank 0's one
        line when ``auto`` turned it on. Every rank decides alike, from the config alone."""
        t = self.t
        positions = memory.positions_per_pass(self.forward.micro_batch_tokens, t.micro_batch_size or t.minibatch_size,
                                              self.s.max_new_tokens)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        on, line = memory.choose_checkpointing(t.gradient_checkpointing, model_config, trained, positions,
                                               supported=trainable.supports_checkpointing(model))
        if line and self.parallel.is_main:
            console.print(line)
        return on

    def _build_method(self) -> None:
        """The segmenter's needs and the credit method's collaborators (a critic for ppo)."""
        settings = self.settings
        self.segment_needs_entropy = needs_entropy(settings.segment.name)
        self.collaborators = {"scorer": self.policy.backend, "policy": self.policy}
        if "critic" in self.spec.needs:
            self.collaborators["critic"] = build_critic(settings.critic, self.policy, settings.seed)
        self.critic = self.collaborators.get("critic")
        self.answer_probe = getattr(self.benchmark, "ANSWER_PROBE", None)
        # A method with a critic fits it on the whole batch, so its credit is computed on the whole batch.
        self.batch_wide = self.spec.batch_wide or self.critic is not None

    def _build_optimizer(self) -> None:
        """AdamW over the trained weights, its LR schedule and the minibatch shuffler."""
        t = self.t
        batch_size = t.prompts_per_step * self.s.n
        updates_total = t.steps * t.updates_per_batch * -(-batch_size // t.minibatch_size)
        self.optimizer = make_optimizer(self.trained, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                                        device=self.policy.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.lr_schedule, t.warmup_steps, updates_total))
        self.generator = torch.Generator().manual_seed(derive_seed(self.settings.seed, "minibatches"))

    def _check_sampling(self) -> None:
        batch_size, t, parallel = self.settings.backend_batch_size, self.t, self.parallel
        self.prompts_per_call = ppc = prompts_per_call(batch_size, self.s.n)
        if parallel.distributed and parallel.shard_chunks and -(-t.prompts_per_step // ppc) < parallel.world_size:
            console.print(f"[yellow]backend.batch_size={batch_size} makes {-(-t.prompts_per_step // ppc)} "
                          f"generate call(s) per step for {parallel.world_size} ranks: some ranks idle while "
                          f"sampling; a smaller backend.batch_size spreads sampling over every rank (and changes "
                          f"the samples)[/yellow]")

    # ------------------------------------------------------------------ the loop

    def fit(self, preempt: preemption.Preemption) -> Fitted:
        """Every step from the first unfinished one: held-out evals when due, rank 0's writes after
        each step, checkpoints when due; then the final checkpoint and held-out eval. ``preempt``:
        the stage's signal handlers (a signal stops start-up at once, a step after it finishes)."""
        t = self.t
        with preempt.at_once(self.parallel):
            self._start()
        first_step = self.state.step + 1
        with progress_bar(f"train {self.spec.name}", total=t.steps, unit="step") as advance:
            advance(first_step - 1)
            for step in range(first_step, t.steps + 1):
                preempt.step = step
                result = self.step(step)
                if t.eval_every and (step % t.eval_every == 0 or step == t.steps):
                    self._eval_into(result.row, step)
                self.state.step = step
                # before the step's checkpoint: a resume reads the rows back; rank 0 writes, and a
                # failure there (a full disk) stops every rank instead of leaving them at the next collective
                self.parallel.on_main(lambda: self.recorder.write(step, result))
                self._count_skipped(step, result.stats)
                stop = preempt.due(self.parallel)  # a signal: checkpoint now (the last step too), then stop
                if stop or (step != t.steps and t.save_every and step % t.save_every == 0):
                    self.checkpoint(step)
                if stop:
                    raise preempt.stop(step, t.steps, self.checkpoints / f"step-{step:06d}", self.parallel.is_main)
                advance(1, info=_progress_info(result.row, result.tokens))
        return self._finish(preempt)

    def step(self, step: int) -> StepResult:
        """One step: sampling -> credit -> update -> refresh -> record."""
        began = time.perf_counter()
        self.clock.reset()
        with self.clock.phase("sampling"):
            samples, drawn, rounds = self.rollouts(step)
        learned = None
        if samples:
            with self.autocast():
                segments, batch, credit = self.credit(samples)
            stats = self.update(batch, credit)
            critic_stats = self.refresh(batch, credit)
            learned = Learned(segments, batch, credit, stats, critic_stats)
        else:
            console.print(f"[yellow]step {step}: no group with differing rewards in {rounds} draws of "
                          f"{self.t.prompts_per_step} problems (train.max_sampling_rounds); no update this "
                          f"step[/yellow]")
        return self.record(step, began, drawn, samples, rounds, learned)

    # ------------------------------------------------------------------ the phases of a step

    def rollouts(self, step: int) -> tuple[list[dict], list[dict], int]:
        """The samples the step trains on, every sample it drew, and the number of draws; moves the
        data cursor."""
        t = self.t
        samples, drawn, self.state.cursor, rounds = training_samples(
            functools.partial(self._draw, step), self.train_problems, self.state.cursor, t.prompts_per_step,
            dynamic=t.dynamic_sampling, max_rounds=t.max_sampling_rounds, order_seed=t.data_order_seed)
        return samples, drawn, rounds

    def _draw(self, step: int, problems: list, round_index: int) -> list[dict]:
        # Round 0 has the seed a step without dynamic sampling has, so the two share it.
        s = self.s
        keys = ("train-sample", step) + ((round_index,) if round_index else ())
        with self.autocast():
            return sample_rows(self.policy, self.benchmark, problems, n=s.n, max_new_tokens=s.max_new_tokens,
                               temperature=s.temperature, top_p=s.top_p, seed=derive_seed(self.settings.seed, *keys),
                               prompts_per_call=self.prompts_per_call, map_chunks=self.parallel.map_chunks)

    def credit(self, samples: list[dict]):
        """The step's segments, credit batch and credit. Under torchrun each rank scores a share of
        the groups and ``gather_credit`` puts the whole batch together (a batch-wide method
        scores them all)."""
        mine = samples if self.batch_wide else self.parallel.groups_share(samples)
        with self.clock.phase("segment"):
            entropies = completion_entropies(self.policy, mine) if self.segment_needs_entropy and mine else None
            segments = segment_rows(mine, self.tokenizer, self.settings.segment, entropies=entropies)
        with self.clock.phase("credit"):
            batch = self._credit_batch(mine, segments)
            credit = attribute(self.spec, batch, self.params, self.collaborators) if mine else None
            if mine is samples:
                return segments, batch, credit
            return gather_credit(self.parallel, samples, segments, batch, credit, self._credit_batch)

    def _credit_batch(self, samples: list[dict], segments: list[dict]):
        return credit_batch(samples, segments, answer_probe=self.answer_probe, benchmark=self.benchmark)

    def update(self, batch, credit: Credit) -> UpdateStats:
        """The policy update on the step's batch and token advantages."""
        self.policy.backend.sleep()  # a vLLM engine frees its weights and KV cache until the sync
        with self.clock.phase("update"):
            return policy_update(self.trained, self.optimizer, self.scheduler,
                                 UpdateBatch(prompt_ids=batch.prompt_token_ids,
                                             completion_ids=batch.completion_token_ids,
                                             advantages=credit.token_advantages, pad_id=self.tokenizer.pad_token_id,
                                             sampler_logprobs=batch.old_logprobs, group_ids=batch.group_ids),
                                 self.hyper, self.engine)

    def refresh(self, batch, credit: Credit):
        """The new weights to the sampler (and the other ranks); the critic fitted, if any (its
        statistics, else None)."""
        with self.clock.phase("refresh"):
            self.parallel.refresh(self.trained, self.policy.model)
            self.policy.backend.sync_weights(self.policy.model)
            if self.critic is None:
                return None
            return self.critic.fit(batch.prompt_token_ids, batch.completion_token_ids, credit.token_values,
                                   credit.value_targets)

    def record(self, step: int, began: float, drawn: list[dict], samples: list[dict], rounds: int,
               learned: Learned | None) -> StepResult:
        """The step's metrics row (every column the run's metrics.parquet has, in one place)."""
        dynamic = self.t.dynamic_sampling
        stats = learned.stats if learned else _NO_UPDATE
        critic_stats = learned.critic_stats if learned else None
        tokens = sum(r["num_tokens"] for r in drawn)
        self.state.tokens_seen += tokens
        row = {
            "step": step,
            "reward_mean": sum(r["reward"] for r in drawn) / len(drawn),
            "accuracy": sum(r["scorable"] and r["reward"] > 0.5 for r in drawn) / len(drawn),
            "loss": stats.loss, "kl": stats.kl_ref, "entropy": stats.entropy,
            "clip_fraction": stats.clip_fraction, "grad_norm": stats.grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "response_tokens_mean": tokens / len(drawn), "tokens": self.state.tokens_seen,
            "seconds": time.perf_counter() - began, "eval_accuracy": None,
            "sampling_rounds": rounds if dynamic else None,
            "groups_trained": len({r["prompt_id"] for r in samples}) if dynamic else None,
            "value_loss": critic_stats.value_loss if critic_stats else None,
            "value_explained_variance": critic_stats.explained_variance if critic_stats else None,
            "sampler_kl": None if math.isnan(stats.sampler_kl) else stats.sampler_kl,
            # sampler vs trainer on the sampled tokens (mismatch.py): NaN, 0 tokens, when not measured
            **stats.mismatch.columns(),
            "overflow_skipped": stats.overflow_skipped if learned else None,
            **self.clock.columns(),
            "credit_forward_tokens": _value_forward_tokens(learned.batch) if learned else None,
            "value_coverage": _value_coverage(learned.batch) if learned else None,
            "advantage_std": (_advantage_std(learned.credit.token_advantages, learned.batch.token_mask)
                              if learned else None),
        }
        return StepResult(row, tokens, samples, learned)

    # ------------------------------------------------------------------ around the steps

    def held_out_eval(self, step: int) -> tuple[list[dict], dict]:
        t, s = self.t, self.s
        with self.autocast():
            return evaluate(self.policy, self.benchmark, self.eval_problems, n=t.eval_samples,
                            ks=[1, t.eval_samples], max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            top_p=s.top_p, seed=derive_seed(self.settings.seed, "eval"),
                            prompts_per_call=self.prompts_per_call, model_name=f"step-{step}",
                            map_chunks=self.parallel.map_chunks)

    def _eval_into(self, row: dict, step: int) -> None:
        with self.clock.phase("eval"):
            _, summary = self.held_out_eval(step)
        row["eval_accuracy"] = summary["pass@1"]
        row["seconds_eval"] = self.clock.seconds["eval"]

    def _start(self) -> None:
        """Step 0's held-out eval, or the state of the checkpoint this run resumes from."""
        self._started, self._cpu_started = time.perf_counter(), time.process_time()
        self.resumed_from = None
        if self.saved is None:
            _, eval_before = self.held_out_eval(0)
            console.print(f"held-out pass@1 before training: {eval_before['pass@1']:.3f}")
            self.state = TrainState(eval_before=eval_before)
            return
        self.state = checkpoint.restore(self.saved, self.parts, self.t.prompts_per_step)
        self.policy.backend.sync_weights(self.policy.model)
        self.resumed_from = self.state.step
        resuming = (f"resuming {self.out.dir} from step {self.state.step} of {self.t.steps} "
                    f"({self.saved[checkpoint.KEY_PATH]})")
        if self.t.resume is None:  # not asked for: say what was found and how to start over instead
            status = self.out.manifest.get("resumed", [{}])[-1].get("found", "running")
            resuming = (f"found an unfinished attempt (status {status!r}): {resuming}; pass train.resume=false "
                        "to start over, or run.tag=NAME to run beside it")
        console.print(resuming)
        self.recorder.restore(self.state.step, checkpoint.saved_history(self.saved))
        self.saved = None  # the loaded trainer_state.pt (optimizer moments, an older one's rows): used up

    def _count_skipped(self, step: int, stats: UpdateStats) -> None:
        """Count the update's skipped (non-finite) minibatch steps; stop a run that diverged."""
        state, limit = self.state, self.t.max_nonfinite_updates
        state.nonfinite_streak = stats.trailing_skipped if stats.updates else state.nonfinite_streak + stats.skipped
        state.skipped_updates += stats.skipped
        if stats.skipped:
            console.print(f"[yellow]step {step}: skipped {stats.skipped} of {stats.skipped + stats.updates} "
                          f"policy updates with a non-finite loss or gradient (weights unchanged by them)[/yellow]")
        if limit and state.nonfinite_streak >= limit:
            _stop_diverged(self.recorder.metrics_path, step, state.nonfinite_streak, limit)

    def _elapsed(self) -> tuple[float, float]:
        """Wall and CPU seconds of this run over every attempt so far."""
        return (self.state.seconds + time.perf_counter() - self._started,
                self.state.cpu_seconds + time.process_time() - self._cpu_started)

    def checkpoint(self, step: int) -> None:
        """``checkpoints/step-N`` (every rank takes part; rank 0 writes and prunes, and its failure
        stops every rank)."""
        self.state.seconds, self.state.cpu_seconds = self._elapsed()
        self._started, self._cpu_started = time.perf_counter(), time.process_time()
        checkpoint.save(self.checkpoints / f"step-{step:06d}", self.state, self.parts, self.config_hash)
        self.parallel.on_main(lambda: checkpoint.prune(self.checkpoints, self.t.keep_checkpoints))

    def _finish(self, preempt: preemption.Preemption) -> Fitted:
        """The final weights and held-out eval; a signal meanwhile stops them at once and checkpoints
        the last step, so a rerun redoes only them."""
        final_dir, steps = self.checkpoints / "final", self.t.steps
        try:
            with preempt.at_once(self.parallel):
                # rank 0 writes; its failure is raised on every rank (not left to the held-out eval's collectives)
                self.parallel.on_main(lambda: _save_checkpoint(self.policy.model, self.tokenizer, final_dir, self.critic,
                                                               dtype_of(self.settings.save_dtype)))
                eval_rows_after, eval_after = self.held_out_eval(steps)
        except preemption.StopNow:
            self.checkpoint(steps)
            raise preempt.stop(steps, steps, self.checkpoints / f"step-{steps:06d}", self.parallel.is_main) from None
        # CPU time of this process's threads (an in-process vLLM engine included; a process of its
        # own, as on GPUs, is not): with several threads busy it exceeds the wall time.
        seconds, cpu_seconds = self._elapsed()
        self.recorder.close()
        return Fitted(self.state, eval_rows_after, eval_after, seconds, cpu_seconds, final_dir, self.resumed_from)


class Recorder:
    """Rank 0's writes while the loop runs: the step's row added to ``metrics.parquet`` after every
    step (a folder of parts, the last one rewritten atomically: store/metrics_log.py), the row sent
    to the trackers of ``tracking=[...]``, and every ``train.save_rollouts`` steps the step's
    samples, segments, credits and advantages (rredcot_cli/store/train_rollouts.py).
    The metrics rows live only in ``metrics`` (its last part) and that folder, not in the loop's
    state or its checkpoints. On the other ranks it keeps and writes nothing."""

    def __init__(self, out, trackers: list[str], config: dict, is_main: bool, method: str, save_rollouts: int):
        self.out, self.is_main, self.method, self.save_rollouts = out, is_main, method, save_rollouts
        self.metrics_path = out.dir / "metrics.parquet"
        self.metrics = metrics_log.MetricsLog(self.metrics_path)  # converts only each step's new row
        self.trackers = _open_trackers(trackers, config, out) if is_main else tracking.Trackers([])

    def restore(self, step: int, saved_rows: list[dict] | None) -> None:
        """The metrics of the steps up to ``step``, the checkpoint a run resumes from: the rows an
        older checkpoint carries, else those metrics.parquet holds (rows written after that
        checkpoint are dropped, in the file too)."""
        if not self.is_main:
            return
        self.metrics.restore(step, None if saved_rows is None else _with_phase_columns(saved_rows))
        self.metrics.write()

    def write(self, step: int, result: StepResult) -> None:
        if not self.is_main:
            return
        self.metrics.append(result.row)
        self.metrics.write()
        self.trackers.log(result.row, step)
        if result.learned and train_rollouts.is_due(step, self.save_rollouts):
            learned = result.learned
            credits, advantages = credit_rows(result.samples, learned.batch, learned.credit, self.method)
            train_rollouts.save(self.out.dir, step, samples=result.samples, segments=learned.segments,
                                credits=credits, advantages=advantages, method=self.method,
                                config_hash=self.out.manifest["config_hash"])

    def close(self) -> None:
        self.trackers.close()


# --------------------------------------------------------------------------- distribution bookkeeping


def gather_credit(parallel: distributed.DataParallel, samples: list[dict], segments: list[dict], mine_batch,
                  mine_credit: Credit | None, pack: Callable[[list[dict], list[dict]], Any]):
    """The whole batch's segments, credit batch and credit from this rank's share of the groups:
    segments all-gathered and the batch packed again (``pack``), the token advantages, segment
    values and credits all-gathered and padded to the batch's widths. The batch keeps this
    rank's ``value_stats``; a rank with no groups this step contributes empty rows."""
    segments = parallel.concat(segments)
    batch = pack(samples, segments)
    batch.extras["value_stats"] = (mine_batch.extras or {}).get("value_stats")  # this rank's share
    mine_credit = mine_credit or Credit(*(torch.zeros(0, 0),) * 3)  # a rank with no groups this step
    return segments, batch, Credit(
        token_advantages=parallel.concat_rows(mine_credit.token_advantages, batch.token_mask.shape[1]),
        segment_values=parallel.concat_rows(mine_credit.segment_values, batch.max_segments, math.nan),
        segment_credits=parallel.concat_rows(mine_credit.segment_credits, batch.max_segments, math.nan))


# --------------------------------------------------------------------------- sampling


def training_samples(draw: Callable[[list, int], list[dict]], problems: list, cursor: int, per_step: int, *,
                     dynamic: bool, max_rounds: int, order_seed: int | None = None
                     ) -> tuple[list[dict], list[dict], int, int]:
    """The samples one step trains on, every sample it drew, the new data cursor and the draws.

    ``draw(problems, round_index)`` samples and verifies a group per problem. Without ``dynamic``
    one draw of the next ``per_step`` problems is the batch. With it (DAPO's dynamic sampling,
    Yu et al. 2025, arXiv 2503.14476) groups whose completions all share one reward are dropped and
    the next ``per_step`` problems drawn until ``per_step`` mixed groups are kept or ``max_rounds``
    draws were made; mixed groups beyond ``per_step`` are dropped too (as verl does), and a problem
    already kept this step (a split smaller than a step's draws wraps around) is not kept again.
    ``order_seed`` (``train.data_order_seed``) shuffles each pass over ``problems`` (``_cycle``).
    """
    if not dynamic:
        batch = draw(_cycle(problems, cursor, per_step, order_seed), 0)
        return batch, batch, cursor + per_step, 1
    drawn: list[dict] = []
    kept: dict[str, list[dict]] = {}
    rounds = 0
    while rounds < max_rounds and len(kept) < per_step:
        batch = draw(_cycle(problems, cursor, per_step, order_seed), rounds)
        cursor += per_step
        rounds += 1
        drawn += batch
        groups: dict[str, list[dict]] = {}
        for row in batch:
            groups.setdefault(row["prompt_id"], []).append(row)
        for prompt_id, group in groups.items():
            if len(kept) < per_step and prompt_id not in kept and len({r["reward"] for r in group}) > 1:
                kept[prompt_id] = group
    return [row for group in kept.values() for row in group], drawn, cursor, rounds


def _cycle(items: list, start: int, count: int, order_seed: int | None = None) -> list:
    """``count`` items from position ``start`` of the stream, wrapping around a split smaller than
    the run needs. Without ``order_seed`` the stream is ``items`` over and over; with it, each pass
    over ``items`` is a permutation drawn from ``(order_seed, pass)``, so the stream is a function
    of the position alone and a resumed run (its cursor restored) draws what an uninterrupted one does."""
    if not items:
        raise TrainingError("the training split is empty")
    if order_seed is None:
        return [items[(start + i) % len(items)] for i in range(count)]
    size = len(items)
    orders = {index: _pass_order(size, order_seed, index) for index in range(start // size, (start + count) // size + 1)}
    return [items[orders[p // size][p % size]] for p in range(start, start + count)]


def _pass_order(size: int, order_seed: int, pass_index: int) -> list[int]:
    """The order of the ``pass_index``-th pass over a split of ``size`` problems under ``order_seed``."""
    order = list(range(size))
    random.Random(derive_seed(order_seed, "data-order", pass_index)).shuffle(order)
    return order


# --------------------------------------------------------------------------- metrics and output


def _advantage_std(advantages: torch.Tensor, mask: torch.Tensor) -> float | None:
    """Std of the (B, T) token advantages over the completion tokens of ``mask`` (None without two)."""
    values = advantages[mask.bool()].double()
    return float(values.std()) if values.numel() > 1 else None


def _value_forward_tokens(batch) -> int | None:
    """Positions the credit method ran through the model for value estimation this step (this
    rank's share under torchrun); None for methods that report none."""
    stats = (batch.extras or {}).get("value_stats") or {}
    return stats.get("forward_tokens")


def _value_coverage(batch) -> float | None:
    """Share of this step's inner segment boundaries whose value rested on evidence (this rank's
    share under torchrun); None for methods that estimate no values, or a step with no inner
    boundary."""
    stats = (batch.extras or {}).get("value_stats") or {}
    boundaries = stats.get("value_boundaries")
    return stats["value_covered"] / boundaries if boundaries else None


def _with_phase_columns(history: list[dict]) -> list[dict]:
    """Metrics rows of an older checkpoint (``checkpoint.saved_history``), with the per-phase
    columns (null) that rows written before they existed lack, so every row has the same columns."""
    names = [*steptime.StepClock().columns(), "credit_forward_tokens", "advantage_std", "value_coverage",
             *mismatch.COLUMNS]
    for row in history:
        for name in names:
            row.setdefault(name, None)
    return history


def _progress_info(row: dict, step_tokens: int) -> str:
    """The progress line's view of a finished step: reward, accuracy, KL, loss, tokens/s (and eval)."""
    info = f"reward {row['reward_mean']:.2f}  acc {row['accuracy']:.2f}"
    info += f"  kl {row['kl']:.4f}" if math.isfinite(row["kl"]) else "  kl -"
    info += f"  loss {row['loss']:.4f}" if math.isfinite(row["loss"]) else "  loss -"
    info += f"  {step_tokens / max(row['seconds'], 1e-9):,.0f} tok/s"
    if row["eval_accuracy"] is not None:
        info += f"  eval {row['eval_accuracy']:.3f}"
    return info


def _open_trackers(names: list[str], config: dict, out) -> tracking.Trackers:
    if not names:
        return tracking.Trackers([])
    run_id = tracking.run_id(out.dir, out.manifest["created"])
    trackers = tracking.open_trackers(names, out.dir, config=config,
                                      run_id=run_id, run_name=out.dir.parent.name)
    console.print(f"tracking: {', '.join(names)} (run id {run_id})")
    return trackers


def _stop_diverged(metrics_path, step, streak, limit) -> None:
    """Stop with one line saying why and what to try (the metrics so far, this step's included,
    are already in ``metrics_path``: ``Recorder.write``)."""
    raise TrainingError(
        f"step {step}: {streak} policy updates in a row had a non-finite (NaN/inf) loss or gradient "
        f"(train.max_nonfinite_updates={limit}); they were skipped, so the weights are the last finite ones; "
        f"metrics so far are in {metrics_path}; try a lower train.lr or a smaller train.grad_clip"
    )


def _save_checkpoint(model, tokenizer, path, critic, dtype):
    """A plain HF model folder in ``dtype`` (weights + tokenizer, and ``critic.pt`` for a method
    with a critic), written atomically."""
    with runs.atomic_path(path) as tmp:
        trainable.export_checkpoint(model, tokenizer, tmp, dtype)
        if critic is not None:
            critic.save_weights(tmp / "critic.pt")
    return path
