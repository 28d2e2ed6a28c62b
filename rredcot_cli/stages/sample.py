"""`rredcot sample`: G completions per prompt over a benchmark split, rewarded by the verifier."""

from __future__ import annotations

import time

from omegaconf import DictConfig

from rredcot_cli.rng import derive_seed, seed_everything
from rredcot_cli.store import artifacts, runs
from rredcot_cli.console import console, progress_bar
from rredcot_cli.pipeline import prompts_per_call, sample_rows
from rredcot_cli.stages.common import make_benchmark, make_policy

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "sampling", "sample"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    out = runs.begin_stage(cfg, "sample", overrides, inputs={}, keys=CONFIG_KEYS)
    if out is None:
        return
    seed_everything(cfg.seed)
    benchmark = make_benchmark(cfg)
    problems = benchmark.load(cfg.sample.split, limit=cfg.sample.num_prompts)
    policy = make_policy(cfg)

    started = time.perf_counter()
    with progress_bar(f"sample {benchmark.name}/{cfg.sample.split}", total=len(problems), unit="problems") as advance:
        rows = _sample(cfg, policy, benchmark, problems, advance)
    seconds = time.perf_counter() - started

    path = artifacts.write_artifact("samples", rows, out.dir / "samples.parquet")
    accuracy = sum(r["reward"] for r in rows) / max(1, len(rows))
    tokens = sum(r["num_tokens"] for r in rows)
    out.finish({"samples": path}, extra={"seconds": seconds, "completions": len(rows), "generated_tokens": tokens,
                                         "reward_mean": accuracy})
    console.print(f"wrote {len(rows)} completions ({tokens} tokens, reward mean {accuracy:.3f}) "
                  f"in {seconds:.1f}s to [bold]{path}[/bold]")


def _sample(cfg, policy, benchmark, problems, advance):
    s = cfg.sampling
    return sample_rows(policy, benchmark, problems, n=s.n, max_new_tokens=s.max_new_tokens,
                       temperature=s.temperature, top_p=s.top_p, seed=derive_seed(cfg.seed, "sample"),
                       prompts_per_call=prompts_per_call(cfg.backend.batch_size, s.n), on_progress=advance)
