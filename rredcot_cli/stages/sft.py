"""`rredcot sft`: train the embedded tiny model from scratch on the synthetic benchmark's gold
solutions. With its defaults it reproduces the checkpoint shipped in rredcot_cli/assets;
``sft.init`` continues from an existing model (e.g. ``sft.init=tiny-chain`` for longer chains)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rredcot_cli.errors import RredcotError
from rredcot_cli.rng import seed_everything
from rredcot_cli.store import runs
from rredcot_cli.console import console
from rredcot_cli.benchmarks import benchmark_from_settings, make_benchmark
from rredcot_cli.train.sft import train_sft
from rredcot_cli.policy.models import shipped_model_dir

CONFIG_KEYS = ["seed", "benchmark", "sft"]


def run(cfg: DictConfig, overrides: list[str]) -> None:
    init = _init_path(cfg.sft.init)  # checked before a run folder is made
    out = runs.begin_stage(cfg, "sft", overrides, inputs={}, keys=CONFIG_KEYS)
    if out is None:
        return
    seed_everything(cfg.seed)
    f = cfg.sft

    # SFT data uses shorter chains than RL (sft.min_steps/max_steps) to leave room for RL.
    # The benchmark's own options travel with it (chain_tail's tail_lines), so the SFT targets
    # have the format that RL on the same benchmark config grades.
    settings = dataclasses.replace(OmegaConf.to_object(cfg.benchmark), min_steps=f.min_steps, max_steps=f.max_steps)
    benchmark = benchmark_from_settings(settings)
    if not hasattr(benchmark, "solution"):
        raise RredcotError(f"rredcot sft needs a synthetic benchmark with gold solutions (chain, chain_verbose, chain_tail, search), "
                           f"not benchmark={cfg.benchmark.name}")
    mix = None
    if f.mix_benchmark and f.mix_fraction > 0:
        mix = make_benchmark(f.mix_benchmark, min_steps=f.min_steps, max_steps=f.max_steps,
                             data_seed=cfg.benchmark.data_seed + 1)
        if not hasattr(mix, "solution"):
            raise RredcotError(f"sft.mix_benchmark={f.mix_benchmark}: rehearsal needs a synthetic benchmark with "
                               f"gold solutions (chain, chain_verbose, search)")
    model_dir = out.dir / "model"
    with runs.atomic_path(model_dir) as tmp:  # a killed run never leaves a half-written model
        result = train_sft(OmegaConf.to_object(f), benchmark=benchmark, output_dir=tmp, seed=cfg.seed, init=init,
                           mix_benchmark=mix)
    out.finish({"model": model_dir / "model.safetensors"}, extra=result)
    console.print(f"trained the tiny model in {result.get('seconds', 0):.0f}s -> [bold]{model_dir}[/bold] "
                  f"(use it with model.path={model_dir})")


def _init_path(init: str | None) -> str | None:
    """``sft.init`` as a folder: a path, or the name of a model shipped in rredcot_cli/assets."""
    if not init:
        return None
    folder = shipped_model_dir(init) or Path(init)
    if not (folder / "config.json").is_file():
        raise RredcotError(f"sft.init={init}: no model there (no config.json); give a model folder or a shipped "
                           f"model's name (tiny-chain)")
    return str(folder)
