"""Config-to-object glue shared by the stages. The only place that reads config groups for
constructing things; everything below it takes explicit arguments."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


def make_benchmark(cfg: DictConfig):
    """The benchmark of ``cfg.benchmark``: every setting but the name and the splits goes to
    ``benchmarks.make_benchmark``, which hands each constructor the ones it takes."""
    from rredcot_cli.benchmarks import make_benchmark as build

    settings = OmegaConf.to_container(cfg.benchmark, resolve=True)
    for key in ("train_split", "eval_split"):
        settings.pop(key, None)
    return build(settings.pop("name"), **settings)


def make_policy(cfg: DictConfig, model_path: str | None = None):
    import torch

    from rredcot_cli.policy.load import load_policy

    if cfg.backend.num_threads > 0:
        torch.set_num_threads(cfg.backend.num_threads)
    return load_policy(
        model_path=model_path or cfg.model.path,
        dtype=cfg.model.dtype,
        trust_remote_code=cfg.model.trust_remote_code,
        chat_template=cfg.model.chat_template,
        backend=cfg.backend.name,
        device=cfg.backend.device,
        batch_size=cfg.backend.batch_size,
        seed=cfg.seed,
        gpu_memory_utilization=cfg.backend.gpu_memory_utilization,
        tensor_parallel_size=cfg.backend.tensor_parallel_size,
        enforce_eager=cfg.backend.enforce_eager,
        kv_cache_gb=cfg.backend.kv_cache_gb,
        max_model_len=cfg.backend.max_model_len,
        sleep_mode=cfg.backend.sleep_mode,
        sync_check_atol=cfg.backend.sync_check_atol,
        kv_cache_dtype=cfg.backend.kv_cache_dtype,
    )


def method_and_params(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The registry entry of ``cfg.method.name`` and its hyper-parameters as plain kwargs."""
    from rredcot_cli.methods import get_method

    spec = get_method(cfg.method.name)
    params = {k: v for k, v in OmegaConf.to_container(cfg.method, resolve=True).items() if k != "name"}
    return spec, params


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
    """A ``ValueCritic`` on a copy of the policy's body, from ``critic.init``: "policy" (zero value
    head) or a critic.pt written by ``rredcot train``."""
    from rredcot_cli.train.critic import ValueCritic
    from rredcot_cli.config.compose import ConfigError

    c = cfg.critic
    critic = ValueCritic.from_policy(policy.model, pad_id=policy.tokenizer.pad_token_id, lr=c.lr,
                                     updates_per_batch=c.updates_per_batch, minibatch_size=c.minibatch_size,
                                     value_clip=c.value_clip, grad_clip=c.grad_clip, weight_decay=c.weight_decay,
                                     seed=cfg.seed)
    if c.init != "policy":
        if not Path(c.init).is_file():
            raise ConfigError(f"critic.init={c.init}: no such file; use critic.init=policy or the critic.pt "
                              f"of a ppo run (RUN/train/checkpoints/final/critic.pt)")
        try:
            critic.load_weights(c.init)
        except ValueError as e:
            raise ConfigError(f"critic.init={c.init}: {e}; it must be the critic.pt of a ppo run with this model") from e
    return critic


def segmenter_and_kwargs(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The segmentation rule and its keyword arguments: every ``segment.*`` field but the name
    (each rule takes them all, so rules share one signature)."""
    from rredcot_cli.segmenters import get_segmenter

    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.segment, resolve=True).items() if k != "name"}
    return get_segmenter(cfg.segment.name), kwargs


def prompts_per_call(batch_size: int, n: int) -> int:
    """How many prompts one generate() call takes so that prompts x n fits the batch size;
    ``batch_size`` 0 (or less): all of them, in one call (``sys.maxsize``)."""
    if batch_size <= 0:
        return sys.maxsize
    return max(1, batch_size // max(1, n))


@contextmanager
def progress_bar(description: str, total: int, transient: bool = False) -> Iterator[Any]:
    """A rich progress bar on stderr; yields ``advance(k, **fields)``."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=transient) as progress:
        task = progress.add_task(description, total=total, info="")

        def advance(k: int = 1, info: str | None = None) -> None:
            progress.update(task, advance=k, **({"info": info} if info is not None else {}))

        yield advance


def table_rows(table) -> list[dict]:
    """A pyarrow table as a list of row dicts."""
    return table.to_pylist()


def read_segmented_samples(inputs: dict) -> tuple[list[dict], list[dict]]:
    """Sample and segment rows from ``inputs["samples"]`` / ``inputs["segments"]``, refusing
    segments that do not tile those samples' completions exactly."""
    from rredcot_cli.store import artifacts

    samples = artifacts.read_artifact("samples", inputs["samples"])
    segments = artifacts.read_artifact("segments", inputs["segments"])
    artifacts.validate_segments_tile(segments, samples)
    return table_rows(samples), table_rows(segments)
