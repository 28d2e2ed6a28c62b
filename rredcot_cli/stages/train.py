"""`rredcot train`: the policy loop (the algorithm and its launch lines: rredcot_cli/train/loop.py).

This file turns the config into settings (the update's hyper-parameters, the precision, the
data-parallel group, the trackers), begins the stage (``runs.begin_stage``: the run folder, its
manifest and config hash; ``train.resume=true`` continues an unfinished attempt), runs
``Trainer(...).fit()``, and on rank 0 writes the results (metrics.parquet, eval.parquet,
summary.json), finishes the stage and prints the before/after table.

Every ``train.save_every`` steps the loop writes ``checkpoints/step-N`` (rredcot_cli/train/checkpoint.py:
weights, optimizer, scheduler, RNG states, data cursor, critic, metrics so far); since sampling
seeds are derived from (seed, step), the resumed steps equal those of an uninterrupted run.
``train.keep_checkpoints`` deletes all but the newest step-N checkpoints after each one.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig
from rich.table import Table

from rredcot_cli.store import artifacts, runs, train_rollouts

from rredcot_cli.train import distributed, tracking
from rredcot_cli.errors import TrainingError
from rredcot_cli.train.precision import resolve_precision
from rredcot_cli.stages.common import console, method_and_params
from rredcot_cli.train.loop import Fitted, Trainer
from rredcot_cli.train.update import UpdateHyper, old_from_sampler

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "segment", "method", "sampling", "train"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    spec, params = method_and_params(cfg)
    t = cfg.train
    _check_options(t)
    trackers = tracking.check(list(cfg.tracking))
    precision = _precision(t.precision, cfg.model.dtype)
    parallel = _data_parallel(t, cfg.backend.name, precision)
    out = parallel.on_main(lambda: runs.begin_stage(_hashed_config(cfg), "train", overrides, inputs={},
                                                    keys=config_keys(spec), resume=t.resume))
    if out is None:
        return
    fitted = Trainer(cfg, spec=spec, params=params, out=out, parallel=parallel, precision=precision,
                     hyper=update_hyper(cfg, precision.name, spec.token_selection(params)),
                     trackers=trackers).fit()
    if parallel.is_main:  # rank 0 writes every artifact
        _write_results(spec.name, t.steps, out, fitted, trackers)
    parallel.barrier()
    parallel.close()


def update_hyper(cfg: DictConfig, precision: str, token_selection=None) -> UpdateHyper:
    """The ``train.*`` hyper-parameters of each policy update, and the credit method's token
    selection (``MethodSpec.token_selection``; None: every token)."""
    t = cfg.train
    return UpdateHyper(
        updates_per_batch=t.updates_per_batch, minibatch_size=t.minibatch_size, clip_low=t.clip_low,
        clip_high=t.clip_high, loss_agg=t.loss_agg, max_tokens=cfg.sampling.max_new_tokens, kl_coef=t.kl_coef,
        kl_estimator=t.kl_estimator, kl_clamp=t.kl_clamp, clip_ratio_c=t.clip_ratio_c, grad_clip=t.grad_clip,
        sampler_correction=t.sampler_correction, sampler_cap=t.sampler_correction_cap,
        query_preserved=t.query_preserved_minibatches, reward_balanced=t.reward_balanced_minibatches,
        token_selection=token_selection,
        # The sampler's log-probs stand in for the pre-update pass where they are the same numbers.
        old_from_sampler=old_from_sampler(t.old_logprobs, cfg.backend.name, precision, t.sampler_correction,
                                          cfg.backend.kv_cache_dtype))


def _write_results(method: str, steps: int, out, fitted: Fitted, trackers: list[str]) -> None:
    """metrics.parquet, eval.parquet and summary.json; the stage finished; the before/after table."""
    state = fitted.state
    metrics_path = out.dir / "metrics.parquet"
    artifacts.write_artifact("train_metrics", state.history, metrics_path)
    eval_path = artifacts.write_artifact("eval", fitted.eval_rows_after, out.dir / "eval.parquet")
    summary = {"method": method, "steps": steps, "seconds": fitted.seconds, "cpu_seconds": fitted.cpu_seconds,
               "generated_tokens": state.tokens_seen,
               "skipped_updates": state.skipped_updates, "eval_before": state.eval_before,
               "eval_after": fitted.eval_after, "checkpoint": str(fitted.checkpoint),
               "tracking": _tracking_record(trackers, out), "saved_rollouts": train_rollouts.saved_steps(out.dir)}
    runs.atomic_write_text(out.dir / "summary.json", json.dumps(summary, indent=2))
    out.finish({"metrics": metrics_path, "eval": eval_path, "summary": out.dir / "summary.json"},
               extra={"seconds": fitted.seconds, "resumed_from_step": fitted.resumed_from,
                      "tracking": summary["tracking"]})
    _print_summary(method, state.history, state.eval_before, fitted.eval_after, fitted.seconds, fitted.checkpoint)


def config_keys(spec) -> list[str]:
    """The config groups that name a training run of ``spec``: ``critic.*`` only for a method that
    trains a critic, so changing it does not make other runs stale."""
    return CONFIG_KEYS + (["critic"] if "critic" in spec.needs else [])


def _hashed_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the ``schema.EXECUTION_KEYS`` at their defaults: the config that names the run
    (its hash and its config.yaml), the same whether or not it is resumed."""
    from omegaconf import OmegaConf

    from rredcot_cli.config.schema import EXECUTION_KEYS, Config

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



def _check_options(t) -> None:
    """Refuse a misspelled or impossible train.* choice before any model is loaded."""
    from rredcot_cli.train.loss import LOSS_AGGREGATIONS, SAMPLER_CORRECTIONS
    from rredcot_cli.train.update import OLD_LOGPROBS

    choices = {"loss_agg": LOSS_AGGREGATIONS, "sampler_correction": SAMPLER_CORRECTIONS,
               "lr_schedule": ("constant", "linear", "cosine"), "kl_estimator": ("k1", "k3"),
               "old_logprobs": OLD_LOGPROBS}
    for key, valid in choices.items():
        if t[key] not in valid:
            raise TrainingError(f"train.{key}={t[key]}: unknown; valid: {', '.join(valid)}")
    if 0 < t.clip_ratio_c <= 1:
        raise TrainingError(f"train.clip_ratio_c={t.clip_ratio_c}: the dual clip needs > 1 (verl: 3.0); 0 turns it off")
    if t.dist_timeout_s <= 0:
        raise TrainingError(f"train.dist_timeout_s={t.dist_timeout_s}: must be > 0 seconds")
    for key in ("micro_batch_size", "logprob_chunk_tokens"):
        if t[key] < 0:
            raise TrainingError(f"train.{key}={t[key]}: must be >= 0 (0 turns it off)")
    if t.sampler_correction_cap <= 0:
        raise TrainingError(f"train.sampler_correction_cap={t.sampler_correction_cap}: must be > 0")
    if t.sampler_correction == "geometric_mask" and t.sampler_correction_cap <= 1:
        raise TrainingError(f"train.sampler_correction_cap={t.sampler_correction_cap}: geometric_mask keeps rows "
                            "whose geometric-mean ratio is in [1/cap, cap], so the cap must be > 1")
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
