"""The builders the stages share: each turns a config group into its typed settings (the
schema's dataclass, ``OmegaConf.to_object``) and hands them to the wing that builds the object
(benchmark, policy, segmentation, critic); nothing below the stages takes the composed config."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
import torch

from rredcot_cli.config.schema import SegmentConfig
from rredcot_cli.console import console
from rredcot_cli.benchmarks import benchmark_from_settings
from rredcot_cli.methods import method_and_params as from_settings
from rredcot_cli.store import artifacts
from rredcot_cli.policy.load import load_policy
from rredcot_cli.train.critic import build_critic


def make_benchmark(cfg: DictConfig):
    """The benchmark of ``cfg.benchmark`` (``benchmarks.benchmark_from_settings``)."""
    return benchmark_from_settings(OmegaConf.to_object(cfg.benchmark))


def make_policy(cfg: DictConfig):
    """The policy of the ``model.*`` and ``backend.*`` settings (``policy.load.load_policy``), with
    ``backend.num_threads`` torch threads."""
    if cfg.backend.num_threads > 0:
        torch.set_num_threads(cfg.backend.num_threads)
    return load_policy(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.backend), cfg.seed)


def method_and_params(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The registry entry of ``cfg.method.name`` and its hyper-parameters as plain kwargs."""
    return from_settings(OmegaConf.to_container(cfg.method, resolve=True))


def make_collaborators(cfg: DictConfig, spec: Any, policy: Any) -> dict[str, Any]:
    """What the method ``spec`` declares it needs, built from ``policy`` and the config: the
    policy and its scorer for model-based methods, a learned critic (``critic.*``) for ppo."""
    collaborators: dict[str, Any] = {"scorer": policy.backend, "policy": policy}
    if "critic" in spec.needs:
        collaborators["critic"] = make_critic(cfg, policy)
    return collaborators


def warn_if_untrained_critic(cfg: DictConfig, spec: Any) -> None:
    """Outside training, a critic from ``critic.init=policy`` says V = 0 everywhere: say so."""
    if "critic" in spec.needs and cfg.critic.init == "policy":
        console.print(f"[yellow]{spec.name}: critic.init=policy is an untrained critic (V = 0 everywhere); "
                      f"pass critic.init=RUN/train/checkpoints/final/critic.pt to use a trained one[/yellow]")


def make_critic(cfg: DictConfig, policy: Any):
    """A ``ValueCritic`` on a copy of the policy's body, from ``critic.*`` (``critic.build_critic``)."""
    return build_critic(OmegaConf.to_object(cfg.critic), policy, cfg.seed)


def segment_settings(cfg: DictConfig) -> SegmentConfig:
    """The ``segment.*`` settings, typed (``segment.name`` is one of the rules: checked at compose time)."""
    return OmegaConf.to_object(cfg.segment)


def table_rows(table) -> list[dict]:
    """A pyarrow table as a list of row dicts."""
    return table.to_pylist()


def read_segmented_samples(inputs: dict) -> tuple[list[dict], list[dict]]:
    """Sample and segment rows from ``inputs["samples"]`` / ``inputs["segments"]``, refusing
    segments that do not tile those samples' completions exactly."""
    samples = artifacts.read_artifact("samples", inputs["samples"])
    segments = artifacts.read_artifact("segments", inputs["segments"])
    artifacts.validate_segments_tile(segments, samples)
    return table_rows(samples), table_rows(segments)
