"""`rredcot train`: the policy loop. Every step samples a group per prompt, segments the
completions, asks the chosen credit method for per-token advantages, and takes clipped-ratio
policy-gradient steps. The loop never looks at which method it runs.
"""

from __future__ import annotations

import copy
import json
import time

import torch
from omegaconf import DictConfig
from rich.table import Table

from rredcot_cli import artifacts, runs
from rredcot_cli.rollout import attribute, completion_entropies, credit_batch, evaluate, sample_rows, segment_rows
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.stages.common import (
    console,
    make_benchmark,
    make_policy,
    method_and_params,
    progress_bar,
    prompts_per_call,
    seed_everything,
    segmenter_and_kwargs,
)
from rredcot_cli.update import lr_lambda, policy_update

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "segment", "method", "sampling", "train"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    spec, params = method_and_params(cfg)
    out = runs.begin_stage(cfg, "train", overrides, inputs={}, keys=CONFIG_KEYS)
    if out is None:
        return
    t, s = cfg.train, cfg.sampling
    seed_everything(cfg.seed)
    benchmark = make_benchmark(cfg)
    train_problems = benchmark.load(cfg.benchmark.train_split, limit=t.steps * t.prompts_per_step)
    eval_problems = benchmark.load(cfg.benchmark.eval_split, limit=t.eval_problems)
    policy = make_policy(cfg)
    model, tokenizer = policy.model, policy.tokenizer
    reference = _frozen_copy(model) if t.kl_coef else None
    segmenter, segment_kwargs = segmenter_and_kwargs(cfg)
    segment_needs_entropy = needs_entropy(cfg.segment.name)
    collaborators = {"scorer": policy.backend, "policy": policy}

    batch_size = t.prompts_per_step * s.n
    updates_total = t.steps * t.updates_per_batch * -(-batch_size // t.minibatch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.lr_schedule, t.warmup_steps, updates_total))
    generator = torch.Generator().manual_seed(runs.derive_seed(cfg.seed, "minibatches"))
    ppc = prompts_per_call(cfg.backend.batch_size, s.n)

    def held_out_eval(step: int) -> tuple[list[dict], dict]:
        return evaluate(policy, benchmark, eval_problems, n=t.eval_samples, ks=[1, t.eval_samples],
                        max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                        seed=runs.derive_seed(cfg.seed, "eval"), prompts_per_call=ppc, model_name=f"step-{step}")

    started = time.perf_counter()
    _, eval_before = held_out_eval(0)
    console.print(f"held-out pass@1 before training: {eval_before['pass@1']:.3f}")
    history: list[dict] = []
    tokens_seen = 0
    with progress_bar(f"train {spec.name}", total=t.steps) as advance:
        for step in range(1, t.steps + 1):
            step_started = time.perf_counter()
            problems = _cycle(train_problems, (step - 1) * t.prompts_per_step, t.prompts_per_step)
            samples = sample_rows(policy, benchmark, problems, n=s.n, max_new_tokens=s.max_new_tokens,
                                  temperature=s.temperature, top_p=s.top_p,
                                  seed=runs.derive_seed(cfg.seed, "train-sample", step), prompts_per_call=ppc)
            entropies = completion_entropies(policy, samples) if segment_needs_entropy else None
            segments = segment_rows(samples, tokenizer, segmenter, cfg.segment.name, entropies=entropies,
                                    **segment_kwargs)
            batch = credit_batch(samples, segments, answer_probe=getattr(benchmark, "ANSWER_PROBE", None))
            credit = attribute(spec, batch, params, collaborators)
            stats = policy_update(
                model, optimizer, scheduler,
                prompt_ids=batch.prompt_token_ids, completion_ids=batch.completion_token_ids,
                advantages=credit.token_advantages, pad_id=tokenizer.pad_token_id,
                reference=reference, updates_per_batch=t.updates_per_batch, minibatch_size=t.minibatch_size,
                clip_low=t.clip_low, clip_high=t.clip_high, loss_agg=t.loss_agg, max_tokens=s.max_new_tokens,
                kl_coef=t.kl_coef, kl_estimator=t.kl_estimator, grad_clip=t.grad_clip, generator=generator,
            )
            policy.backend.sync_weights(model)

            tokens = sum(r["num_tokens"] for r in samples)
            tokens_seen += tokens
            row = {
                "step": step,
                "reward_mean": sum(r["reward"] for r in samples) / len(samples),
                "accuracy": sum(r["scorable"] and r["reward"] > 0.5 for r in samples) / len(samples),
                "loss": stats.loss, "kl": stats.kl_ref, "entropy": stats.entropy,
                "clip_fraction": stats.clip_fraction, "grad_norm": stats.grad_norm, "lr": stats.lr,
                "response_tokens_mean": tokens / len(samples), "tokens": tokens_seen,
                "seconds": time.perf_counter() - step_started, "eval_accuracy": None,
            }
            if t.eval_every and (step % t.eval_every == 0 or step == t.steps):
                _, summary = held_out_eval(step)
                row["eval_accuracy"] = summary["pass@1"]
            if t.save_every and step % t.save_every == 0 and step != t.steps:
                _save_checkpoint(model, tokenizer, out.dir / "checkpoints" / f"step-{step:06d}")
            history.append(row)
            info = f"reward {row['reward_mean']:.2f}"
            if row["eval_accuracy"] is not None:
                info += f"  eval {row['eval_accuracy']:.3f}"
            advance(1, info=info)

    final_dir = _save_checkpoint(model, tokenizer, out.dir / "checkpoints" / "final")
    eval_rows_after, eval_after = held_out_eval(t.steps)
    seconds = time.perf_counter() - started
    metrics_path = artifacts.write_artifact("train_metrics", history, out.dir / "metrics.parquet")
    eval_path = artifacts.write_artifact("eval", eval_rows_after, out.dir / "eval.parquet")
    summary = {"method": spec.name, "steps": t.steps, "seconds": seconds, "generated_tokens": tokens_seen,
               "eval_before": eval_before, "eval_after": eval_after, "checkpoint": str(final_dir)}
    runs.atomic_write_text(out.dir / "summary.json", json.dumps(summary, indent=2))
    out.finish({"metrics": metrics_path, "eval": eval_path, "summary": out.dir / "summary.json"},
               extra={"seconds": seconds})
    _print_summary(spec.name, history, eval_before, eval_after, seconds, final_dir)


def _cycle(items: list, start: int, count: int) -> list:
    """``count`` items from ``start``, wrapping around a split smaller than the run needs."""
    if not items:
        raise ValueError("the training split is empty")
    return [items[(start + i) % len(items)] for i in range(count)]


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def _save_checkpoint(model, tokenizer, path):
    with runs.atomic_path(path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
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
