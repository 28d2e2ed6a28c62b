"""`rredcot eval`: pass@1 (mean over n samples), unbiased pass@k, maj@k and accuracy by chain
length, for the configured model (the embedded one, a hub id, or a checkpoint folder)."""

from __future__ import annotations

import json
import time

from omegaconf import DictConfig
from rich.table import Table

from rredcot_cli.rng import derive_seed, seed_everything
from rredcot_cli.store import artifacts, runs
from rredcot_cli.console import console, print_table, progress_bar
from rredcot_cli.pipeline import evaluate, prompts_per_call
from rredcot_cli.stages.common import make_benchmark, make_policy

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "sampling", "eval"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    out = runs.begin_stage(cfg, "eval", overrides, inputs={}, keys=CONFIG_KEYS)
    if out is None:
        return
    e = cfg.eval
    seed_everything(cfg.seed)
    benchmark = make_benchmark(cfg)
    problems = benchmark.load(e.split, limit=e.num_problems)
    policy = make_policy(cfg)

    started = time.perf_counter()
    with progress_bar(f"eval {benchmark.name}/{e.split}", total=len(problems), unit="problems") as advance:
        rows, summary = evaluate(policy, benchmark, problems, n=e.n, ks=list(e.k),
                                 max_new_tokens=cfg.sampling.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
                                 seed=derive_seed(cfg.seed, "eval"),
                                 prompts_per_call=prompts_per_call(cfg.backend.batch_size, e.n),
                                 model_name=cfg.model.path, on_progress=advance)
    summary.update(seconds=time.perf_counter() - started, model=cfg.model.path, benchmark=benchmark.name,
                   split=e.split, problems=len(problems), n=e.n, temperature=e.temperature)
    eval_path = artifacts.write_artifact("eval", rows, out.dir / "eval.parquet")
    metrics_path = out.dir / "metrics.json"
    runs.atomic_write_text(metrics_path, json.dumps(summary, indent=2))
    out.finish({"eval": eval_path, "metrics": metrics_path})
    print_eval_table(summary)
    console.print(f"wrote [bold]{eval_path}[/bold] and [bold]{metrics_path}[/bold]")


def print_eval_table(summary: dict) -> None:
    table = Table(title=f"{summary['model']} on {summary['benchmark']}/{summary['split']} "
                        f"({summary['problems']} problems x {summary['n']} samples)", header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key.startswith(("pass@", "maj@")) or key in ("unscorable_fraction", "mean_tokens"):
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    print_table(table)
    by_steps = summary.get("accuracy_by_steps")
    if by_steps:
        lengths = Table(title="accuracy by chain length (steps)", header_style="bold")
        lengths.add_column("steps", justify="right")
        lengths.add_column("accuracy", justify="right")
        lengths.add_column("completions", justify="right")
        for steps, bucket in by_steps.items():
            lengths.add_row(str(steps), f"{bucket['accuracy']:.3f}", str(bucket["num_samples"]))
        print_table(lengths)
