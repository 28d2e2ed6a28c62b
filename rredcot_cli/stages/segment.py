"""`rredcot segment`: split every saved completion into segments that tile its tokens."""

from __future__ import annotations

from omegaconf import DictConfig
from transformers import AutoTokenizer

from rredcot_cli.store import artifacts, runs
from rredcot_cli.console import console
from rredcot_cli.stages.common import make_policy, segment_settings, table_rows
from rredcot_cli.pipeline import completion_entropies, segment_rows
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.policy.models import resolve_model_path

CONFIG_KEYS = ["segment", "model"]  # the tokenizer decides the token texts; the model, entropies


def run(cfg: DictConfig, overrides: list[str]) -> None:
    samples_path = runs.find_input(cfg, "samples")
    out = runs.begin_stage(cfg, "segment", overrides, inputs={"samples": samples_path}, keys=CONFIG_KEYS)
    if out is None:
        return
    samples = table_rows(artifacts.read_artifact("samples", samples_path))
    settings = segment_settings(cfg)

    entropies = None
    if needs_entropy(settings.name):
        # Entropy-based rules need a scoring pass of the model that sampled.
        policy = make_policy(cfg)
        tokenizer, entropies = policy.tokenizer, completion_entropies(policy, samples)
    else:
        tokenizer = _tokenizer(cfg)
    rows = segment_rows(samples, tokenizer, settings, entropies=entropies)
    path = artifacts.write_artifact("segments", rows, out.dir / "segments.parquet")
    out.finish({"segments": path}, extra={"segments": len(rows), "completions": len(samples)})
    console.print(f"wrote {len(rows)} segments for {len(samples)} completions "
                  f"({len(rows) / max(1, len(samples)):.1f} per completion) to [bold]{path}[/bold]")


def _tokenizer(cfg: DictConfig):
    return AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path), trust_remote_code=cfg.model.trust_remote_code)
