"""`rredcot train`: the policy loop (the algorithm and its launch lines: rredcot_cli/train/loop.py).

This file turns the config into settings (the loop's ``TrainSettings``, the update's
hyper-parameters, the precision, the data-parallel group, the trackers), builds the benchmark, the
policy and the credit method, begins the stage (``runs.begin_stage``: the run folder, its
manifest and config hash; an unfinished attempt with the same config is continued, saying so,
unless ``train.resume=false``), runs ``Trainer(...).fit()`` under the preemption handlers of
``train.preempt_signals`` (rredcot_cli/train/preemption.py, active for the whole stage), and on
rank 0 writes the results (eval.parquet, summary.json; the loop wrote metrics.parquet after every
step), finishes the stage and prints the before/after table.

Every ``train.save_every`` steps the loop writes ``checkpoints/step-N`` (rredcot_cli/train/checkpoint.py:
weights, optimizer, scheduler, RNG states, data cursor, critic; a resume reads the metrics so far
back from metrics.parquet); since sampling
seeds are derived from (seed, step), the resumed steps equal those of an uninterrupted run.
``train.keep_checkpoints`` deletes all but the newest step-N checkpoints after each one.
"""

from __future__ import annotations

import gc
import json

from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from rredcot_cli.console import console, print_table
from rredcot_cli.rng import seed_everything
from rredcot_cli.store import artifacts, metrics_log, runs, train_rollouts

from rredcot_cli.train import distributed, memory, preemption, tracking, trainable
from rredcot_cli.errors import Preempted, StorageError, TrainingError, stop_exit_status, stop_status
from rredcot_cli.train.precision import resolve_precision
from rredcot_cli.stages.common import make_benchmark, make_policy, method_and_params, segment_settings
from rredcot_cli.train.checkpoint import last_complete
from rredcot_cli.train.loop import Fitted, Trainer, TrainSettings
from rredcot_cli.train.update import UpdateHyper, old_from_sampler
from rredcot_cli.config.schema import EXECUTION_KEYS, Config
from rredcot_cli.train.loss import LossSettings

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "segment", "method", "sampling", "train"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    # first, before anything is built: what torch frees then leaves the resident set (train/memory.py)
    memory.return_freed_memory_to_os()
    spec, params = method_and_params(cfg)
    t = cfg.train  # its choices and cross-checks were checked at compose time (config/ranges.py)
    trackers = tracking.check(list(cfg.tracking))
    precision = _precision(t.precision, cfg.model.dtype)
    parallel = _data_parallel(t, cfg.backend, precision, spec.name)
    with preemption.Preemption(t.preempt_signals) as preempt:  # the whole stage: no signal goes unrecorded
        out = parallel.on_main(lambda: runs.begin_stage(_hashed_config(cfg), "train", overrides, inputs={},
                                                        keys=config_keys(spec), resume=t.resume))
        if out is None:
            return
        try:
            with preempt.at_once(parallel):  # start-up: nothing to finish, so a signal stops it at once
                settings = train_settings(cfg)
                seed_everything(cfg.seed)
                benchmark = make_benchmark(cfg)
                policy = make_policy(cfg)
                trainer = Trainer(settings, benchmark=benchmark, policy=policy, spec=spec, params=params,
                                  out=out, parallel=parallel, precision=precision,
                                  hyper=update_hyper(cfg, precision.name, spec.token_selection(params)),
                                  trackers=trackers)
            fitted = trainer.fit(preempt)
            weight_sync = _weight_sync_record(policy.backend, parallel)
            # rank 0 writes every artifact; its failure stops every rank (not left at the barrier below)
            parallel.on_main(lambda: _write_results(spec.name, t.steps, out, fitted, trackers, weight_sync))
        except StorageError as e:  # a full disk mid-run: say what a resume starts from
            raise e.keeping(kept_for_resume(out.dir, t.save_every)) from e
        except (preemption.StopNow, KeyboardInterrupt) as e:  # stopped at once: what a rerun resumes from
            raise _stopped_at_once(out, getattr(e, "signal_name", "SIGINT"), parallel.is_main) from None
        except Preempted as e:  # a checkpoint of the last step was written (train/preemption.py)
            if parallel.is_main:
                out.stopped(e.status, step=e.step, signal=e.signal_name)
            raise
    # The data-parallel wrapper goes before the process group: DDP's C++ reducer holds the gloo
    # group, and freeing it last (at this function's return, after destroy_process_group) runs
    # the group's destructor with the GIL held while it joins a worker thread that needs the GIL
    # to free a tensor of the last collective: a deadlock at exit, 1 run in 4 on this machine
    # (py-spy: ~Reducer -> ~ProcessGroupGloo -> thread::join; pytorch/pytorch#56297). Freed here,
    # the group outlives it and is destroyed by destroy_process_group, whose binding drops the GIL.
    del trainer, fitted
    gc.collect()
    parallel.barrier()
    # A vLLM engine under torchrun lives in the job's process group and tears it down when it
    # shuts down: shut it down here, after the last collective, not at interpreter exit.
    if parallel.distributed and hasattr(policy.backend, "close"):
        policy.backend.close()
    parallel.close()


def _stopped_at_once(out, signal_name: str, is_main: bool) -> Preempted:
    """The ``Preempted`` of a run a signal stopped at once (start-up, the final weights and eval, a
    second Ctrl-C), its manifest marked: a rerun resumes from the last complete checkpoint."""
    found = last_complete(out.dir / "checkpoints")
    step = int(found.name.split("-")[1]) if found else 0
    if is_main:
        out.stopped(stop_status(signal_name), step=step, signal=signal_name)
    then = (f"rerun the same command to continue from step {step} ({found})" if found
            else "no step checkpoint was written yet: rerun the same command to start again")
    message = f"{stop_status(signal_name)} by {signal_name}: stopped at once; {then} (exit status {stop_exit_status(signal_name)})"
    return Preempted(message if is_main else "", step, signal_name)


def kept_for_resume(train_dir, save_every: int) -> str:
    """What a train run that failed to write keeps, and how to continue it."""
    found = last_complete(train_dir / "checkpoints")
    if found is None:
        return (f"no step checkpoint was complete yet (train.save_every={save_every}); free space and rerun "
                "(with train.resume=true it starts over from step 0)")
    return (f"the last complete checkpoint, step {int(found.name.split('-')[1])} ({found}), is kept; free space "
            "and rerun with train.resume=true")


def train_settings(cfg: DictConfig) -> TrainSettings:
    """What the loop reads from the config, as typed settings (the schema's dataclasses)."""
    lora = cfg.model.lora
    return TrainSettings(
        seed=cfg.seed, train=OmegaConf.to_object(cfg.train), sampling=OmegaConf.to_object(cfg.sampling),
        critic=OmegaConf.to_object(cfg.critic), train_split=cfg.benchmark.train_split,
        eval_split=cfg.benchmark.eval_split, backend_batch_size=cfg.backend.batch_size,
        segment=segment_settings(cfg),
        lora=trainable.LoraSettings(**OmegaConf.to_container(lora)) if lora.r > 0 else None,
        save_dtype=cfg.model.dtype, tracked_config=OmegaConf.to_container(cfg, resolve=True))


def update_hyper(cfg: DictConfig, precision: str, token_selection=None) -> UpdateHyper:
    """The ``train.*`` hyper-parameters of each policy update, and the credit method's token
    selection (``MethodSpec.token_selection``; None: every token)."""
    t = cfg.train
    return UpdateHyper(
        updates_per_batch=t.updates_per_batch, minibatch_size=t.minibatch_size,
        loss=LossSettings(clip_low=t.clip_low, clip_high=t.clip_high, loss_agg=t.loss_agg,
                          max_tokens=cfg.sampling.max_new_tokens, kl_coef=t.kl_coef, kl_estimator=t.kl_estimator,
                          kl_clamp=t.kl_clamp, clip_ratio_c=t.clip_ratio_c),
        grad_clip=t.grad_clip,
        sampler_correction=t.sampler_correction, sampler_cap=t.sampler_correction_cap,
        query_preserved=t.query_preserved_minibatches, reward_balanced=t.reward_balanced_minibatches,
        token_selection=token_selection,
        # The sampler's log-probs stand in for the pre-update pass where they are the same numbers.
        old_from_sampler=old_from_sampler(t.old_logprobs, cfg.backend.name, precision, t.sampler_correction,
                                          cfg.backend.kv_cache_dtype))


def _weight_sync_record(backend, parallel: distributed.DataParallel) -> list[dict] | None:
    """Every rank's ``sync_report`` (vLLM: how weights reached its engine, how many syncs, the
    ``backend.sync_check_atol`` gaps), for the manifest; None for a backend without syncs.
    Collective."""
    report = getattr(backend, "sync_report", None)
    return parallel.all_gather_object(report()) if report else None


def _write_results(method: str, steps: int, out, fitted: Fitted, trackers: list[str],
                   weight_sync: list[dict] | None = None) -> None:
    """eval.parquet and summary.json (metrics.parquet holds every step: the loop writes it after
    each); the stage finished; the before/after table."""
    state = fitted.state
    metrics_path = out.dir / "metrics.parquet"
    metrics = metrics_log.read(metrics_path)
    eval_path = artifacts.write_artifact("eval", fitted.eval_rows_after, out.dir / "eval.parquet")
    summary = {"method": method, "steps": steps, "seconds": fitted.seconds, "cpu_seconds": fitted.cpu_seconds,
               "generated_tokens": state.tokens_seen,
               "skipped_updates": state.skipped_updates, "eval_before": state.eval_before,
               "eval_after": fitted.eval_after, "checkpoint": str(fitted.checkpoint),
               "tracking": _tracking_record(trackers, out), "saved_rollouts": train_rollouts.saved_steps(out.dir)}
    runs.atomic_write_text(out.dir / "summary.json", json.dumps(summary, indent=2))
    out.finish({"metrics": metrics_path, "eval": eval_path, "summary": out.dir / "summary.json"},
               extra={"seconds": fitted.seconds, "resumed_from_step": fitted.resumed_from,
                      "tracking": summary["tracking"],
                      **({"weight_sync": weight_sync} if weight_sync is not None else {})})
    _print_summary(method, metrics, state.eval_before, fitted.eval_after, fitted.seconds, fitted.checkpoint)


def config_keys(spec) -> list[str]:
    """The config groups that name a training run of ``spec``: ``critic.*`` only for a method that
    trains a critic, so changing it does not make other runs stale."""
    return CONFIG_KEYS + (["critic"] if "critic" in spec.needs else [])


def _hashed_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the ``schema.EXECUTION_KEYS`` at their defaults: the config that names the run
    (its hash and its config.yaml), the same whether or not it is resumed."""
    container = OmegaConf.to_container(cfg, resolve=True)
    defaults = OmegaConf.structured(Config)
    for key in EXECUTION_KEYS:
        group, name = key.split(".", 1)
        if group in container and name in container[group]:
            container[group][name] = OmegaConf.select(defaults, key)
    hashed = OmegaConf.create(container)
    OmegaConf.set_readonly(hashed, True)
    return hashed


def _tracking_record(names: list[str], out) -> dict | None:
    return {"trackers": names, "run_id": tracking.run_id(out.dir, out.manifest["created"])} if names else None



def _data_parallel(t, backend_cfg, precision, method: str) -> distributed.DataParallel:
    """This process's place in a torchrun job (world size 1 without one), or a one-line refusal
    of what does not work under data parallelism yet."""
    try:
        parallel = distributed.init(t.parallel, t.dist_timeout_s)
    except ValueError as e:
        raise TrainingError(str(e)) from e
    if parallel.distributed:
        console.quiet = not parallel.is_main  # one progress bar and one table, from rank 0
        # vLLM: an engine per rank (or tensor-parallel group) splits every generate call itself.
        parallel.shard_chunks = backend_cfg.name != "vllm"
        if backend_cfg.name == "vllm" and backend_cfg.tensor_parallel_size > 1 and method == "mc":
            raise TrainingError(f"method=mc with backend=vllm under torchrun and backend.tensor_parallel_size="
                                f"{backend_cfg.tensor_parallel_size}: each rank samples continuations for its own "
                                "groups, which the ranks sharing a tensor-parallel engine cannot; use "
                                "tensor_parallel_size=1")
        if parallel.mode == "fsdp2" and precision.loss_scaling:
            raise TrainingError(f"train.precision={precision.name} with train.parallel=fsdp2: fp16 loss scaling "
                                "over sharded gradients is not supported; use bf16-mixed or fp32")
    return parallel


def _precision(name: str, model_dtype: str):
    try:
        return resolve_precision(name, model_dtype)
    except ValueError as e:
        raise TrainingError(str(e)) from e


def _print_summary(method, metrics, before, after, seconds, checkpoint) -> None:
    """The before/after table from the held-out evals and ``metrics`` (the metrics.parquet table)."""
    table = Table(title=f"rredcot train · {method}", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for key in [k for k in after if k.startswith(("pass@", "maj@"))]:
        table.add_row(f"held-out {key}", f"{before[key]:.3f}", f"{after[key]:.3f}")
    first, last = metrics.slice(0, 1).to_pylist()[0], metrics.slice(metrics.num_rows - 1).to_pylist()[0]
    table.add_row("train reward (first/last step)", f"{first['reward_mean']:.3f}", f"{last['reward_mean']:.3f}")
    table.add_row("response tokens", f"{first['response_tokens_mean']:.0f}", f"{last['response_tokens_mean']:.0f}")
    print_table(table)
    console.print(f"{metrics.num_rows} steps in {seconds / 60:.1f} min; checkpoint: [bold]{checkpoint}[/bold]")
