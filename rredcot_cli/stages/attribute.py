"""`rredcot attribute`: run a credit method over saved samples and segments.

Writes per-segment values/credits and per-token advantages under ``attribute/<method>/`` so
several methods can be compared on the same traces without retraining.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig

from rredcot_cli.store import artifacts, runs
from rredcot_cli.console import console
from rredcot_cli.stages.common import (
    make_benchmark,
    make_collaborators,
    make_policy,
    method_and_params,
    read_segmented_samples,
    warn_if_untrained_critic,
)
from rredcot_cli.pipeline import attribute, credit_batch, credit_rows


def run(cfg: DictConfig, overrides: list[str]) -> None:
    spec, params = method_and_params(cfg)
    inputs = {"samples": runs.find_input(cfg, "samples"), "segments": runs.find_input(cfg, "segments")}
    # Model-based methods depend on the model that scores; outcome-only ones do not.
    keys = ["method", "seed"] + (["model", "backend", "benchmark"] if spec.needs else [])
    keys += ["critic"] if "critic" in spec.needs else []
    out = runs.begin_stage(cfg, "attribute", overrides, inputs=inputs, keys=keys, subdir=spec.name)
    if out is None:
        return
    samples, segments = read_segmented_samples(inputs)

    collaborators = make_collaborators(cfg, spec, make_policy(cfg)) if spec.needs else {}
    warn_if_untrained_critic(cfg, spec)
    started = time.perf_counter()
    benchmark = make_benchmark(cfg)
    batch = credit_batch(samples, segments, answer_probe=getattr(benchmark, "ANSWER_PROBE", None), benchmark=benchmark)
    credit = attribute(spec, batch, params, collaborators)
    seconds = time.perf_counter() - started

    credits, advantages = credit_rows(samples, batch, credit, spec.name)
    credits_path = artifacts.write_artifact("credits", credits, out.dir / "credits.parquet")
    adv_path = artifacts.write_artifact("advantages", advantages, out.dir / "advantages.parquet")
    out.finish({"credits": credits_path, "advantages": adv_path}, extra={"seconds": seconds})
    console.print(f"{spec.name}: credited {len(credits)} segments of {len(advantages)} completions "
                  f"in {seconds:.2f}s -> [bold]{out.dir}[/bold]")
