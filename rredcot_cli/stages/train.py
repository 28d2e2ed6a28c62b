"""`rredcot train`: the policy loop. Every step samples a group per prompt, segments the
completions, asks the chosen credit method for per-token advantages, and takes clipped-ratio
policy-gradient steps. The loop never looks at which method it runs.

With ``train.dynamic_sampling`` (DAPO) a step draws more problems until it has
``prompts_per_step`` groups whose rewards differ; a method with a learned critic (ppo) gets one
from ``critic.*`` and the loop fits it to the method's value targets after each policy update.

Every ``train.save_every`` steps it writes ``checkpoints/step-N``: the weights plus the optimizer,
LR scheduler, RNG states (torch, numpy, python, the minibatch shuffler), the step, the data cursor
(the next training problem), the critic's state if there is one, and the metrics so far.
``train.resume=true`` continues an unfinished run from the latest one; since sampling seeds are
derived from (seed, step), the resumed steps equal those of an uninterrupted run.
``train.keep_checkpoints`` deletes all but the newest step-N checkpoints after each one.

While it runs, rank 0 rewrites ``metrics.parquet`` (atomically) after every step, sends the row to
the trackers of ``tracking=[...]`` (rredcot_cli/tracking.py), and every ``train.save_rollouts``
steps keeps the step's samples, segments, credits and advantages (rredcot_cli/train_rollouts.py).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re
import shutil
import time
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from rredcot_cli import artifacts, distributed, runs, steptime, tracking, train_rollouts, trainable
from rredcot_cli.errors import TrainingError
from rredcot_cli.methods.base import Credit
from rredcot_cli.precision import GradientStepper, dtype_of, make_optimizer, resolve_precision
from rredcot_cli.rollout import attribute, completion_entropies, credit_batch, evaluate, sample_rows, segment_rows
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.stages.common import (
    console,
    make_benchmark,
    make_collaborators,
    make_policy,
    method_and_params,
    progress_bar,
    prompts_per_call,
    seed_everything,
    segmenter_and_kwargs,
)
from rredcot_cli.update import (ForwardPass, UpdateStats, auto_micro_batch_tokens, lr_lambda, old_from_sampler,
                                policy_update)

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "segment", "method", "sampling", "train"]
# train.* keys that say how to run, not what to compute: left out of the config hash so that a
# resumed run (or one with another divergence limit, or with smaller micro-batches to fit in
# memory) is the same run.
UNHASHED_TRAIN_KEYS = ("resume", "max_nonfinite_updates", "micro_batch_size", "micro_batch_tokens",
                       "logprob_chunk_tokens",
                       "gradient_checkpointing", "parallel", "dist_timeout_s", "save_rollouts", "keep_checkpoints",
                       "step")
STATE_FILE = "trainer_state.pt"
# 2: the optimizer state is keyed by parameter names (distributed.DataParallel.optimizer_state),
# so a checkpoint resumes in one process, under DDP or under FSDP2, at any world size.
STATE_FORMAT = 2
# A step without an update (dynamic sampling found no mixed group): nothing taken, nothing skipped.
_NO_UPDATE = UpdateStats(loss=float("nan"), clip_fraction=float("nan"), kl_ref=float("nan"),
                         approx_kl_old=float("nan"), entropy=float("nan"), grad_norm=float("nan"), lr=float("nan"),
                         skipped=0, updates=0, trailing_skipped=0)


def run(cfg: DictConfig, overrides: list[str]) -> None:
    spec, params = method_and_params(cfg)
    t, s = cfg.train, cfg.sampling
    _check_options(t)
    trackers_chosen = tracking.check(list(cfg.tracking))
    precision = _precision(t.precision, cfg.model.dtype)
    parallel = _data_parallel(t, cfg.backend.name, precision)
    out = parallel.on_main(lambda: runs.begin_stage(_hashed_config(cfg), "train", overrides, inputs={},
                                                    keys=config_keys(spec), resume=t.resume))
    if out is None:
        return
    checkpoints = out.dir / "checkpoints"
    state = _latest_state(checkpoints, out.manifest["config_hash"]) if t.resume else None
    if t.resume and state is None:
        console.print(f"train.resume=true: no resumable checkpoint in {checkpoints}; starting from step 0")
    if state is None and parallel.is_main:
        # they belong to the attempt this one replaces
        _remove_step_checkpoints(checkpoints)
        shutil.rmtree(out.dir / train_rollouts.FOLDER, ignore_errors=True)
    parallel.barrier()
    seed_everything(cfg.seed)
    benchmark = make_benchmark(cfg)
    draws_per_step = t.max_sampling_rounds if t.dynamic_sampling else 1
    train_problems = benchmark.load(cfg.benchmark.train_split, limit=t.steps * t.prompts_per_step * draws_per_step)
    eval_problems = benchmark.load(cfg.benchmark.eval_split, limit=t.eval_problems)
    if not train_problems:
        raise TrainingError(f"benchmark {benchmark.name}: split {cfg.benchmark.train_split!r} has no problems to train on")
    policy = make_policy(cfg)
    lora = trainable.LoraSettings(**OmegaConf.to_container(cfg.model.lora)) if cfg.model.lora.r > 0 else None
    model = trainable.prepare(policy.model, precision, gradient_checkpointing=t.gradient_checkpointing, lora=lora)
    policy.model = model  # methods score with the policy being trained (adapters included)
    tokenizer = policy.tokenizer
    autocast = functools.partial(precision.autocast, policy.device)
    sampled = s.temperature > 0  # greedy draws have no distribution: score them at temperature 1
    forward = ForwardPass(temperature=s.temperature if sampled else 1.0, top_p=s.top_p if sampled else 1.0,
                          chunk_tokens=t.logprob_chunk_tokens, micro_batch_size=t.micro_batch_size, autocast=autocast,
                          micro_batch_tokens=auto_micro_batch_tokens(t.micro_batch_tokens, policy.device,
                                                                     parallel.world_size))
    # The sampler's log-probs stand in for the pre-update pass where they are the same numbers.
    sampler_is_old = old_from_sampler(t.old_logprobs, cfg.backend.name, precision.name, t.sampler_correction,
                                      cfg.backend.kv_cache_dtype)
    stepper = GradientStepper(precision, policy.device)
    # The initial policy, also when resuming.
    reference, reference_forward = trainable.reference(model, precision, forward) if t.kl_coef else (None, None)
    # One process: trained is model is plain. Under torchrun: the DDP/FSDP2 root the update runs,
    # and the plain model that samples, scores and is saved (distributed.py).
    trained, plain, reference = parallel.wrap(model, reference)
    if plain is not model:  # FSDP2 sharded the model in place: sample from the full copy
        policy.model = plain
        policy.backend.sync_weights(plain)
    segmenter, segment_kwargs = segmenter_and_kwargs(cfg)
    segment_needs_entropy = needs_entropy(cfg.segment.name)
    collaborators = make_collaborators(cfg, spec, policy)
    critic = collaborators.get("critic")

    batch_size = t.prompts_per_step * s.n
    updates_total = t.steps * t.updates_per_batch * -(-batch_size // t.minibatch_size)
    optimizer = make_optimizer(trained, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                               device=policy.device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.lr_schedule, t.warmup_steps, updates_total))
    generator = torch.Generator().manual_seed(runs.derive_seed(cfg.seed, "minibatches"))
    ppc = prompts_per_call(cfg.backend.batch_size, s.n)
    if parallel.distributed and -(-t.prompts_per_step // ppc) < parallel.world_size:
        console.print(f"[yellow]backend.batch_size={cfg.backend.batch_size} makes {-(-t.prompts_per_step // ppc)} "
                      f"generate call(s) per step for {parallel.world_size} ranks: some ranks idle while sampling; "
                      f"a smaller backend.batch_size spreads sampling over every rank (and changes the samples)"
                      f"[/yellow]")
    if t.dynamic_sampling and t.max_sampling_rounds < 1:
        raise TrainingError(f"train.max_sampling_rounds={t.max_sampling_rounds}: dynamic sampling needs at least 1")

    def draw(step: int, problems: list, round_index: int) -> list[dict]:
        # Round 0 has the seed a step without dynamic sampling has, so the two share it.
        keys = ("train-sample", step) + ((round_index,) if round_index else ())
        with autocast():
            return sample_rows(policy, benchmark, problems, n=s.n, max_new_tokens=s.max_new_tokens,
                               temperature=s.temperature, top_p=s.top_p, seed=runs.derive_seed(cfg.seed, *keys),
                               prompts_per_call=ppc, map_chunks=parallel.map_chunks)

    answer_probe = getattr(benchmark, "ANSWER_PROBE", None)
    # A method with a critic fits it on the whole batch, so its credit is computed on the whole batch.
    batch_wide = spec.batch_wide or critic is not None

    def assign_credit(samples: list[dict]):
        """The step's segments, credit batch and credit. Under torchrun each rank scores a share of
        the groups and the token advantages, segment values and credits are all-gathered (a
        batch-wide method scores them all)."""
        mine = samples if batch_wide else parallel.groups_share(samples)
        with clock.phase("segment"):
            entropies = completion_entropies(policy, mine) if segment_needs_entropy and mine else None
            segments = segment_rows(mine, tokenizer, segmenter, cfg.segment.name, entropies=entropies,
                                    **segment_kwargs)
        with clock.phase("credit"):
            return _credit(samples, mine, segments)

    def _credit(samples: list[dict], mine: list[dict], segments: list[dict]):
        batch = credit_batch(mine, segments, answer_probe=answer_probe, benchmark=benchmark)
        credit = attribute(spec, batch, params, collaborators) if mine else None
        if mine is samples:
            return segments, batch, credit
        segments = parallel.concat(segments)
        mine_batch, batch = batch, credit_batch(samples, segments, answer_probe=answer_probe, benchmark=benchmark)
        batch.extras["value_stats"] = (mine_batch.extras or {}).get("value_stats")  # this rank's share
        mine_credit = credit or Credit(*(torch.zeros(0, 0),) * 3)  # a rank with no groups this step
        return segments, batch, Credit(
            token_advantages=parallel.concat_rows(mine_credit.token_advantages, batch.token_mask.shape[1]),
            segment_values=parallel.concat_rows(mine_credit.segment_values, batch.max_segments, math.nan),
            segment_credits=parallel.concat_rows(mine_credit.segment_credits, batch.max_segments, math.nan))

    def held_out_eval(step: int) -> tuple[list[dict], dict]:
        with autocast():
            return evaluate(policy, benchmark, eval_problems, n=t.eval_samples, ks=[1, t.eval_samples],
                            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                            seed=runs.derive_seed(cfg.seed, "eval"), prompts_per_call=ppc, model_name=f"step-{step}",
                            map_chunks=parallel.map_chunks)

    clock = steptime.StepClock()  # seconds per phase of each step, in the metrics row
    started, cpu_started = time.perf_counter(), time.process_time()
    metrics_path = out.dir / "metrics.parquet"
    trackers = _open_trackers(trackers_chosen, cfg, out) if parallel.is_main else tracking.Trackers([])
    if state is None:
        _, eval_before = held_out_eval(0)
        console.print(f"held-out pass@1 before training: {eval_before['pass@1']:.3f}")
        progress = {"step": 0, "cursor": 0, "history": [], "tokens_seen": 0, "eval_before": eval_before,
                    "seconds": 0.0, "nonfinite_streak": 0, "skipped_updates": 0}
    else:
        progress = _restore(state, trained, plain, parallel, optimizer, scheduler, generator, critic, stepper)
        progress.setdefault("cursor", progress["step"] * t.prompts_per_step)  # states written before the cursor
        policy.backend.sync_weights(plain)
        eval_before = progress["eval_before"]
        console.print(f"resuming {out.dir} from step {progress['step']} of {t.steps} ({state['path']})")
    history: list[dict] = _with_phase_columns(progress["history"])
    tokens_seen = progress["tokens_seen"]
    streak = progress["nonfinite_streak"]
    skipped_total = progress["skipped_updates"]
    cursor = progress["cursor"]
    first_step = progress["step"] + 1
    with progress_bar(f"train {spec.name}", total=t.steps) as advance:
        advance(first_step - 1)
        for step in range(first_step, t.steps + 1):
            step_started = time.perf_counter()
            clock.reset()
            with clock.phase("sampling"):
                samples, drawn, cursor, rounds = training_samples(functools.partial(draw, step), train_problems,
                                                                  cursor, t.prompts_per_step, dynamic=t.dynamic_sampling,
                                                                  max_rounds=t.max_sampling_rounds)
            stats, critic_stats = _NO_UPDATE, None
            if samples:
                with autocast():
                    segments, batch, credit = assign_credit(samples)
                policy.backend.sleep()  # a vLLM engine frees its weights and KV cache until the sync
                with clock.phase("update"):
                    stats = policy_update(
                    trained, optimizer, scheduler,
                    prompt_ids=batch.prompt_token_ids, completion_ids=batch.completion_token_ids,
                    advantages=credit.token_advantages, pad_id=tokenizer.pad_token_id,
                    reference=reference, updates_per_batch=t.updates_per_batch, minibatch_size=t.minibatch_size,
                    clip_low=t.clip_low, clip_high=t.clip_high, loss_agg=t.loss_agg, max_tokens=s.max_new_tokens,
                    kl_coef=t.kl_coef, kl_estimator=t.kl_estimator, grad_clip=t.grad_clip, generator=generator,
                    forward=forward, reference_forward=reference_forward, stepper=stepper,
                    sampler_logprobs=batch.old_logprobs,
                    sampler_correction=t.sampler_correction, sampler_cap=t.sampler_correction_cap,
                    parallel=parallel, clock=clock, old_from_sampler=sampler_is_old,
                )
                with clock.phase("refresh"):
                    parallel.refresh(trained, plain)
                    policy.backend.sync_weights(plain)
                    if critic is not None:
                        critic_stats = critic.fit(batch.prompt_token_ids, batch.completion_token_ids,
                                                  credit.token_values, credit.value_targets)
            else:
                console.print(f"[yellow]step {step}: no group with differing rewards in {rounds} draws of "
                              f"{t.prompts_per_step} problems (train.max_sampling_rounds); no update this step[/yellow]")

            tokens = sum(r["num_tokens"] for r in drawn)
            tokens_seen += tokens
            row = {
                "step": step,
                "reward_mean": sum(r["reward"] for r in drawn) / len(drawn),
                "accuracy": sum(r["scorable"] and r["reward"] > 0.5 for r in drawn) / len(drawn),
                "loss": stats.loss, "kl": stats.kl_ref, "entropy": stats.entropy,
                "clip_fraction": stats.clip_fraction, "grad_norm": stats.grad_norm, "lr": scheduler.get_last_lr()[0],
                "response_tokens_mean": tokens / len(drawn), "tokens": tokens_seen,
                "seconds": time.perf_counter() - step_started, "eval_accuracy": None,
                "sampling_rounds": rounds if t.dynamic_sampling else None,
                "groups_trained": len({r["prompt_id"] for r in samples}) if t.dynamic_sampling else None,
                "value_loss": critic_stats.value_loss if critic_stats else None,
                "value_explained_variance": critic_stats.explained_variance if critic_stats else None,
                "sampler_kl": None if math.isnan(stats.sampler_kl) else stats.sampler_kl,
                "overflow_skipped": stats.overflow_skipped if stats is not _NO_UPDATE else None,
                **clock.columns(),
                "credit_forward_tokens": _value_forward_tokens(batch) if samples else None,
                "advantage_std": _advantage_std(credit.token_advantages, batch.token_mask) if samples else None,
            }
            if t.eval_every and (step % t.eval_every == 0 or step == t.steps):
                with clock.phase("eval"):
                    _, summary = held_out_eval(step)
                row["eval_accuracy"] = summary["pass@1"]
                row["seconds_eval"] = clock.seconds["eval"]
            history.append(row)
            if parallel.is_main:  # rank 0 writes every artifact, each as soon as its step ends
                artifacts.write_artifact("train_metrics", history, metrics_path)
                trackers.log(row, step)
                if samples and train_rollouts.is_due(step, t.save_rollouts):
                    train_rollouts.save(out.dir, step, samples=samples, segments=segments, batch=batch, credit=credit,
                                        method=spec.name, config_hash=out.manifest["config_hash"])
            streak = stats.trailing_skipped if stats.updates else streak + stats.skipped
            skipped_total += stats.skipped
            if stats.skipped:
                console.print(f"[yellow]step {step}: skipped {stats.skipped} of {stats.skipped + stats.updates} "
                              f"policy updates with a non-finite loss or gradient (weights unchanged by them)[/yellow]")
            if t.max_nonfinite_updates and streak >= t.max_nonfinite_updates:
                _stop_diverged(out.dir, history, step, streak, t.max_nonfinite_updates, parallel.is_main)
            if t.save_every and step % t.save_every == 0 and step != t.steps:
                progress.update(step=step, cursor=cursor, tokens_seen=tokens_seen, nonfinite_streak=streak,
                                skipped_updates=skipped_total,
                                seconds=progress["seconds"] + time.perf_counter() - started,
                                cpu_seconds=progress.get("cpu_seconds", 0.0) + time.process_time() - cpu_started)
                started, cpu_started = time.perf_counter(), time.process_time()
                _save_state(checkpoints / f"step-{step:06d}", trained, plain, parallel, tokenizer, optimizer,
                            scheduler, generator, critic, stepper, progress, out.manifest["config_hash"])
                if parallel.is_main:
                    _prune_step_checkpoints(checkpoints, t.keep_checkpoints)
            advance(1, info=_progress_info(row, tokens))

    final_dir = checkpoints / "final"
    if parallel.is_main:
        _save_checkpoint(plain, tokenizer, final_dir, critic, dtype_of(cfg.model.dtype))
    eval_rows_after, eval_after = held_out_eval(t.steps)
    seconds = progress["seconds"] + time.perf_counter() - started
    # CPU time of this process's threads (an in-process vLLM engine included; a process of its own,
    # as on GPUs, is not): with several threads busy it exceeds the wall time.
    cpu_seconds = progress.get("cpu_seconds", 0.0) + time.process_time() - cpu_started
    if not parallel.is_main:  # rank 0 writes every artifact
        parallel.barrier()
        parallel.close()
        return
    trackers.close()
    artifacts.write_artifact("train_metrics", history, metrics_path)
    eval_path = artifacts.write_artifact("eval", eval_rows_after, out.dir / "eval.parquet")
    summary = {"method": spec.name, "steps": t.steps, "seconds": seconds, "cpu_seconds": cpu_seconds,
               "generated_tokens": tokens_seen,
               "skipped_updates": skipped_total, "eval_before": eval_before, "eval_after": eval_after,
               "checkpoint": str(final_dir), "tracking": _tracking_record(trackers_chosen, out),
               "saved_rollouts": train_rollouts.saved_steps(out.dir)}
    runs.atomic_write_text(out.dir / "summary.json", json.dumps(summary, indent=2))
    out.finish({"metrics": metrics_path, "eval": eval_path, "summary": out.dir / "summary.json"},
               extra={"seconds": seconds, "resumed_from_step": first_step - 1 if state is not None else None,
                      "tracking": summary["tracking"]})
    _print_summary(spec.name, history, eval_before, eval_after, seconds, final_dir)
    parallel.barrier()
    parallel.close()


def config_keys(spec) -> list[str]:
    """The config groups that name a training run of ``spec``: ``critic.*`` only for a method that
    trains a critic, so changing it does not make other runs stale."""
    return CONFIG_KEYS + (["critic"] if "critic" in spec.needs else [])


def _hashed_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the ``UNHASHED_TRAIN_KEYS`` at their defaults: the config that names the run
    (its hash and its config.yaml), the same whether or not it is resumed."""
    from omegaconf import OmegaConf

    from rredcot_cli.schema import TrainConfig

    container = OmegaConf.to_container(cfg, resolve=True)
    defaults = TrainConfig()
    for key in UNHASHED_TRAIN_KEYS:
        container["train"][key] = getattr(defaults, key)
    hashed = OmegaConf.create(container)
    OmegaConf.set_readonly(hashed, True)
    return hashed


def _advantage_std(advantages: torch.Tensor, mask: torch.Tensor) -> float | None:
    """Std of the (B, T) token advantages over the completion tokens of ``mask`` (None without two)."""
    values = advantages[mask.bool()].double()
    return float(values.std()) if values.numel() > 1 else None


def _value_forward_tokens(batch) -> int | None:
    """Positions the credit method ran through the model for value estimation this step (this
    rank's share under torchrun); None for methods that report none."""
    stats = (batch.extras or {}).get("value_stats") or {}
    return stats.get("forward_tokens")


def _with_phase_columns(history: list[dict]) -> list[dict]:
    """Metrics rows of a resumed run, with the per-phase columns (null) that rows written before
    they existed lack, so every row has the same columns."""
    names = [*steptime.StepClock().columns(), "credit_forward_tokens", "advantage_std"]
    for row in history:
        for name in names:
            row.setdefault(name, None)
    return history


def _progress_info(row: dict, step_tokens: int) -> str:
    """The progress line's view of a finished step: reward, accuracy, KL, tokens/s (and eval)."""
    info = f"reward {row['reward_mean']:.2f}  acc {row['accuracy']:.2f}"
    info += f"  kl {row['kl']:.4f}" if math.isfinite(row["kl"]) else "  kl -"
    info += f"  {step_tokens / max(row['seconds'], 1e-9):,.0f} tok/s"
    if row["eval_accuracy"] is not None:
        info += f"  eval {row['eval_accuracy']:.3f}"
    return info


def _tracking_record(names: list[str], out) -> dict | None:
    return {"trackers": names, "run_id": tracking.run_id(out.dir, out.manifest["created"])} if names else None


def _open_trackers(names: list[str], cfg: DictConfig, out) -> tracking.Trackers:
    if not names:
        return tracking.Trackers([])
    run_id = tracking.run_id(out.dir, out.manifest["created"])
    trackers = tracking.open_trackers(names, out.dir, config=OmegaConf.to_container(cfg, resolve=True),
                                      run_id=run_id, run_name=out.dir.parent.name)
    console.print(f"tracking: {', '.join(names)} (run id {run_id})")
    return trackers


def _stop_diverged(folder, history, step, streak, limit, write: bool = True) -> None:
    """Keep the metrics so far (``write``: rank 0), then stop with one line saying why and what to try."""
    metrics_path = folder / "metrics.parquet"
    if write:
        artifacts.write_artifact("train_metrics", history, metrics_path)
    raise TrainingError(
        f"step {step}: {streak} policy updates in a row had a non-finite (NaN/inf) loss or gradient "
        f"(train.max_nonfinite_updates={limit}); they were skipped, so the weights are the last finite ones; "
        f"metrics so far are in {metrics_path}; try a lower train.lr or a smaller train.grad_clip"
    )


# --------------------------------------------------------------------------- resumable state


def _save_state(path, trained, plain, parallel, tokenizer, optimizer, scheduler, generator, critic, stepper,
                progress, config_hash) -> None:
    """One checkpoint folder holding the weights (HF format, in the training precision: float32
    master weights under mixed precision, so a resume continues exactly) and
    ``trainer_state.pt``: the optimizer (keyed by parameter name), scheduler, fp16 loss scaler,
    RNG states, the critic (weights, optimizer, shuffler) if any, step, data cursor and metrics so
    far. Written as a whole atomically by rank 0, so a folder that exists is complete. Every rank
    calls it (the optimizer state of FSDP2 shards is gathered)."""
    optimizer_state = parallel.optimizer_state(trained, optimizer)
    if not parallel.is_main:
        parallel.barrier()
        return
    state = {
        "format": STATE_FORMAT,
        "config_hash": config_hash,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "generator": generator.get_state(),
        "rng": _rng_states(),
        "progress": copy.deepcopy(progress),
        "critic": None if critic is None else critic.state_dict(),
        "loss_scaler": stepper.state_dict(),
    }
    with runs.atomic_path(path) as tmp:
        trainable.save_trained_weights(plain, tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
    parallel.barrier()


def _latest_state(checkpoints, config_hash: str) -> dict | None:
    """The resumable state of the highest ``step-N`` checkpoint made with ``config_hash``."""
    found = []
    for folder in checkpoints.glob("step-*") if checkpoints.is_dir() else []:
        match = re.fullmatch(r"step-(\d+)", folder.name)
        if match and (folder / STATE_FILE).is_file():
            found.append((int(match.group(1)), folder))
    for _, folder in sorted(found, reverse=True):
        try:
            state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable state is skipped, loudly
            console.print(f"[yellow]{folder / STATE_FILE} is unreadable ({type(e).__name__}); trying an older one[/yellow]")
            continue
        if state.get("format") != STATE_FORMAT or state.get("config_hash") != config_hash:
            console.print(f"[yellow]{folder} was made by another config or version; not resuming from it[/yellow]")
            continue
        state["path"] = folder
        return state
    return None


def _restore(state, trained, plain, parallel, optimizer, scheduler, generator, critic, stepper) -> dict:
    """Load the weights of ``state['path']`` and every saved state; returns the progress dict."""
    try:
        trainable.load_trained_weights(plain, state["path"])
    except ValueError as e:
        raise TrainingError(f"cannot resume from {state['path']}: {e}") from e
    parallel.load_weights(trained, plain)
    parallel.load_optimizer_state(trained, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    stepper.load_state_dict(state.get("loss_scaler"))
    _set_rng_states(state["rng"])
    if critic is not None:
        if state.get("critic") is None:
            raise TrainingError(f"cannot resume from {state['path']}: it holds no critic state")
        critic.load_state_dict(state["critic"])
    return state["progress"]


def _rng_states() -> dict:
    """Every random state the loop may draw from, in types ``torch.load(weights_only=True)`` reads."""
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    import numpy as np

    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _remove_step_checkpoints(checkpoints) -> None:
    """Delete ``step-N`` checkpoints left by an earlier attempt this one replaces (a later resume
    must never pick them up)."""
    for folder in checkpoints.glob("step-*") if checkpoints.is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)


def _prune_step_checkpoints(checkpoints, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step-N`` checkpoints (0: keep all); ``final`` and
    anything else in the folder stay. The newest is always kept, so a resume still finds it. Each
    is renamed to a temporary name first, so a kill mid-delete leaves no half checkpoint that a
    resume could pick (a restart deletes the leftover)."""
    if keep <= 0 or not checkpoints.is_dir():
        return
    found = sorted((int(m.group(1)), folder) for folder in checkpoints.iterdir()
                   if (m := re.fullmatch(r"step-(\d+)", folder.name)))
    for _, folder in found[:-keep]:
        doomed = folder.with_name(f"{folder.name}{runs.TMP_MARK}pruned")
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def training_samples(draw: Callable[[list, int], list[dict]], problems: list, cursor: int, per_step: int, *,
                     dynamic: bool, max_rounds: int) -> tuple[list[dict], list[dict], int, int]:
    """The samples one step trains on, every sample it drew, the new data cursor and the draws.

    ``draw(problems, round_index)`` samples and verifies a group per problem. Without ``dynamic``
    one draw of the next ``per_step`` problems is the batch. With it (DAPO's dynamic sampling,
    Yu et al. 2025, arXiv 2503.14476) groups whose completions all share one reward are dropped and
    the next ``per_step`` problems drawn until ``per_step`` mixed groups are kept or ``max_rounds``
    draws were made; mixed groups beyond ``per_step`` are dropped too (as verl does), and a problem
    already kept this step (a split smaller than a step's draws wraps around) is not kept again.
    """
    if not dynamic:
        batch = draw(_cycle(problems, cursor, per_step), 0)
        return batch, batch, cursor + per_step, 1
    drawn: list[dict] = []
    kept: dict[str, list[dict]] = {}
    rounds = 0
    while rounds < max_rounds and len(kept) < per_step:
        batch = draw(_cycle(problems, cursor, per_step), rounds)
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


def _cycle(items: list, start: int, count: int) -> list:
    """``count`` items from ``start``, wrapping around a split smaller than the run needs."""
    if not items:
        raise TrainingError("the training split is empty")
    return [items[(start + i) % len(items)] for i in range(count)]


def _check_options(t) -> None:
    """Refuse a misspelled or impossible train.* choice before any model is loaded."""
    from rredcot_cli.loss import LOSS_AGGREGATIONS, SAMPLER_CORRECTIONS
    from rredcot_cli.update import OLD_LOGPROBS

    choices = {"loss_agg": LOSS_AGGREGATIONS, "sampler_correction": SAMPLER_CORRECTIONS,
               "lr_schedule": ("constant", "linear", "cosine"), "kl_estimator": ("k1", "k3"),
               "old_logprobs": OLD_LOGPROBS}
    for key, valid in choices.items():
        if t[key] not in valid:
            raise TrainingError(f"train.{key}={t[key]}: unknown; valid: {', '.join(valid)}")
    if t.dist_timeout_s <= 0:
        raise TrainingError(f"train.dist_timeout_s={t.dist_timeout_s}: must be > 0 seconds")
    for key in ("micro_batch_size", "logprob_chunk_tokens"):
        if t[key] < 0:
            raise TrainingError(f"train.{key}={t[key]}: must be >= 0 (0 turns it off)")
    if t.sampler_correction_cap <= 0:
        raise TrainingError(f"train.sampler_correction_cap={t.sampler_correction_cap}: must be > 0")
    if t.old_logprobs == "sampler" and t.sampler_correction != "none":
        raise TrainingError(f"train.old_logprobs=sampler with train.sampler_correction={t.sampler_correction}: the "
                            "correction compares the sampler's log-probs with recomputed ones; use recompute or auto")


def _data_parallel(t, backend: str, precision) -> distributed.DataParallel:
    """This process's place in a torchrun job (world size 1 without one), or a one-line refusal
    of what does not work under data parallelism yet."""
    try:
        parallel = distributed.init(t.parallel, t.dist_timeout_s)
    except ValueError as e:
        raise TrainingError(str(e)) from e
    if parallel.distributed:
        console.quiet = not parallel.is_main  # one progress bar and one table, from rank 0
        if backend == "vllm":
            raise TrainingError("backend=vllm under torchrun: one colocated vLLM engine per rank is not implemented "
                                "yet; use backend=hf for data-parallel training, or train with vLLM in one process")
        if parallel.mode == "fsdp2" and precision.loss_scaling:
            raise TrainingError(f"train.precision={precision.name} with train.parallel=fsdp2: fp16 loss scaling "
                                "over sharded gradients is not supported; use bf16-mixed or fp32")
    return parallel


def _precision(name: str, model_dtype: str):
    try:
        return resolve_precision(name, model_dtype)
    except ValueError as e:
        raise TrainingError(str(e)) from e


def _save_checkpoint(model, tokenizer, path, critic, dtype):
    """A plain HF model folder in ``dtype`` (weights + tokenizer, and ``critic.pt`` for a method
    with a critic), written atomically."""
    with runs.atomic_path(path) as tmp:
        trainable.export_checkpoint(model, tokenizer, tmp, dtype)
        if critic is not None:
            critic.save_weights(tmp / "critic.pt")
    return path


def _print_summary(method, history, before, after, seconds, checkpoint) -> None:
    table = Table(title=f"rredcot train · {method}", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for key in [k for k in after if k.startswith(("pass@", "maj@"))]:
        table.add_row(f"held-out {key}", f"{before[key]:.3f}", f"{after[key]:.3f}")
    first, last = history[0], history[-1]
    table.add_row("train reward (first/last step)", f"{first['reward_mean']:.3f}", f"{last['reward_mean']:.3f}")
    table.add_row("response tokens", f"{first['response_tokens_mean']:.0f}", f"{last['response_tokens_mean']:.0f}")
    console.print(table)
    console.print(f"{len(history)} steps in {seconds / 60:.1f} min; checkpoint: [bold]{checkpoint}[/bold]")
