"""The resumable state of a training run: what ``checkpoints/step-N`` holds, and how it is found,
written, read back and pruned.

A step checkpoint is one folder, written as a whole atomically by rank 0 (a folder that exists is
complete): the trained weights in HF format, in the training precision (float32 master weights
under mixed precision, so a resume continues exactly), the tokenizer, and ``trainer_state.pt``, a
dict whose keys are the ``KEY_*`` constants below: the optimizer state (keyed by parameter name),
the LR scheduler, the minibatch shuffler, every RNG state, the critic (weights, optimizer,
shuffler) if any, the fp16 loss scaler, and the ``progress`` (a ``TrainState``: step, data cursor,
tokens seen, ...). ``STATE_FORMAT`` names that layout; a checkpoint of another format or
config hash is never resumed from. The metrics rows are not in it (they would add about 1 kB a
step to every checkpoint): the run's metrics.parquet, written before each checkpoint, holds them
(store/metrics_log.py); checkpoints written before that carry them as ``progress["history"]``
(``saved_history``).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rredcot_cli.store import runs

from rredcot_cli.train import trainable
from rredcot_cli.errors import TrainingError
from rredcot_cli.rng import rng_states, set_rng_states
from rredcot_cli.console import console

STATE_FILE = "trainer_state.pt"
# 2: the optimizer state is keyed by parameter names (distributed.DataParallel.optimizer_state),
# so a checkpoint resumes in one process, under DDP or under FSDP2, at any world size.
STATE_FORMAT = 2
# The keys of trainer_state.pt.
KEY_FORMAT = "format"
KEY_CONFIG_HASH = "config_hash"
KEY_OPTIMIZER = "optimizer"
KEY_SCHEDULER = "scheduler"
KEY_GENERATOR = "generator"
KEY_RNG = "rng"
KEY_PROGRESS = "progress"
KEY_CRITIC = "critic"
KEY_LOSS_SCALER = "loss_scaler"
# Not in the file: where ``latest`` found it.
KEY_PATH = "path"

_STEP_FOLDER = re.compile(r"step-(\d+)")


@dataclass
class TrainState:
    """The progress of a run, saved as ``progress`` in every step checkpoint (a plain dict of
    these fields, in this order)."""

    step: int = 0  # the last finished step
    cursor: int = 0  # the next training problem (dynamic sampling draws more than a step's share)
    tokens_seen: int = 0  # generated tokens so far
    eval_before: dict | None = None  # the held-out eval of the initial policy
    seconds: float = 0.0  # wall time of the earlier attempts, up to their last checkpoint
    nonfinite_streak: int = 0  # skipped (non-finite) policy updates in a row
    skipped_updates: int = 0  # skipped policy updates in all
    cpu_seconds: float = 0.0  # CPU time of the earlier attempts, as ``seconds``

    def progress(self) -> dict:
        """The ``progress`` entry of trainer_state.pt (a deep copy)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_progress(cls, progress: dict, prompts_per_step: int) -> TrainState:
        """The state a checkpoint's ``progress`` holds; states written before the data cursor
        existed have it at ``step x prompts_per_step``."""
        known = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in progress.items() if k in known})
        if "cursor" not in progress:
            state.cursor = state.step * prompts_per_step
        return state


@dataclass
class Stateful:
    """The live objects whose state a step checkpoint saves and restores besides the progress:
    the data-parallel root being ``trained`` and the ``plain`` model (the same object in one
    process; distributed.py), the ``parallel`` group, the tokenizer, optimizer, LR scheduler,
    minibatch shuffler (``generator``), critic (or None) and ``stepper`` (the fp16 loss scaler)."""

    trained: torch.nn.Module
    plain: torch.nn.Module
    parallel: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator
    critic: Any
    stepper: Any


def save(path: Path, state: TrainState, parts: Stateful, config_hash: str) -> None:
    """Write the step checkpoint ``path``. Every rank calls it (the optimizer state of FSDP2
    shards is gathered); rank 0 writes. Rank 0's failure (a full disk) is raised on every rank
    (``on_main``), so no rank is left waiting for it at a barrier until train.dist_timeout_s."""
    optimizer_state = parts.parallel.optimizer_state(parts.trained, parts.optimizer)
    parts.parallel.on_main(lambda: _write(path, state, parts, config_hash, optimizer_state))


def _write(path: Path, state: TrainState, parts: Stateful, config_hash: str, optimizer_state: dict) -> None:
    """Rank 0's part of ``save``: the checkpoint folder, atomically."""
    saved = {
        KEY_FORMAT: STATE_FORMAT,
        KEY_CONFIG_HASH: config_hash,
        KEY_OPTIMIZER: optimizer_state,
        KEY_SCHEDULER: parts.scheduler.state_dict(),
        KEY_GENERATOR: parts.generator.get_state(),
        KEY_RNG: rng_states(),
        KEY_PROGRESS: state.progress(),
        KEY_CRITIC: None if parts.critic is None else parts.critic.state_dict(),
        KEY_LOSS_SCALER: parts.stepper.state_dict(),
    }
    with runs.atomic_path(path, needed=_state_bytes(parts.plain.state_dict(), optimizer_state)) as tmp:
        trainable.save_trained_weights(parts.plain, tmp)
        parts.tokenizer.save_pretrained(tmp)
        torch.save(saved, tmp / STATE_FILE)


def _state_bytes(*states: Any) -> int:
    """Bytes of the tensors in nested dicts/lists (what a checkpoint writes, give or take its
    headers; tied weights count once)."""
    seen, total, stack = set(), 0, list(states)
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            key = (item.data_ptr(), item.numel(), item.dtype) if item.device.type != "meta" else id(item)
            if key not in seen:
                seen.add(key)
                total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def last_complete(checkpoints: Path) -> Path | None:
    """The highest ``step-N`` folder holding a trainer state (what ``train.resume=true`` takes,
    config hash aside), or None."""
    found = [(int(m.group(1)), folder) for folder in (checkpoints.iterdir() if checkpoints.is_dir() else [])
             if (m := _STEP_FOLDER.fullmatch(folder.name)) and (folder / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def latest(checkpoints: Path, config_hash: str) -> dict | None:
    """The saved state (trainer_state.pt's dict, plus ``KEY_PATH``) of the highest ``step-N``
    checkpoint made with ``config_hash`` in this ``STATE_FORMAT``; unreadable ones are skipped."""
    found = []
    for folder in checkpoints.glob("step-*") if checkpoints.is_dir() else []:
        match = _STEP_FOLDER.fullmatch(folder.name)
        if match and (folder / STATE_FILE).is_file():
            found.append((int(match.group(1)), folder))
    for _, folder in sorted(found, reverse=True):
        try:
            saved = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable state is skipped, loudly
            console.print(f"[yellow]{folder / STATE_FILE} is unreadable ({type(e).__name__}); trying an older one[/yellow]")
            continue
        if saved.get(KEY_FORMAT) != STATE_FORMAT or saved.get(KEY_CONFIG_HASH) != config_hash:
            console.print(f"[yellow]{folder} was made by another config or version; not resuming from it[/yellow]")
            continue
        saved[KEY_PATH] = folder
        return saved
    return None


def restore(saved: dict, parts: Stateful, prompts_per_step: int) -> TrainState:
    """Load the weights of the checkpoint ``saved`` came from and every state it holds into
    ``parts``; returns its progress."""
    path = saved[KEY_PATH]
    try:
        trainable.load_trained_weights(parts.plain, path)
    except ValueError as e:
        raise TrainingError(f"cannot resume from {path}: {e}") from e
    parts.parallel.load_weights(parts.trained, parts.plain)
    parts.parallel.load_optimizer_state(parts.trained, parts.optimizer, saved[KEY_OPTIMIZER])
    parts.scheduler.load_state_dict(saved[KEY_SCHEDULER])
    parts.generator.set_state(saved[KEY_GENERATOR])
    parts.stepper.load_state_dict(saved.get(KEY_LOSS_SCALER))
    set_rng_states(saved[KEY_RNG])
    if parts.critic is not None:
        if saved.get(KEY_CRITIC) is None:
            raise TrainingError(f"cannot resume from {path}: it holds no critic state")
        parts.critic.load_state_dict(saved[KEY_CRITIC])
    return TrainState.from_progress(saved[KEY_PROGRESS], prompts_per_step)


def saved_history(saved: dict) -> list[dict] | None:
    """The metrics rows a checkpoint written before metrics.parquet was their only home carries
    (``progress["history"]``), or None."""
    return saved[KEY_PROGRESS].get("history")


def remove_all(checkpoints: Path) -> None:
    """Delete ``step-N`` checkpoints left by an earlier attempt this one replaces (a later resume
    must never pick them up)."""
    for folder in checkpoints.glob("step-*") if checkpoints.is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)


def prune(checkpoints: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step-N`` checkpoints (0: keep all); ``final`` and
    anything else in the folder stay. The newest is always kept, so a resume still finds it. Each
    is renamed to a temporary name first, so a kill mid-delete leaves no half checkpoint that a
    resume could pick (a restart deletes the leftover)."""
    if keep <= 0 or not checkpoints.is_dir():
        return
    found = sorted((int(m.group(1)), folder) for folder in checkpoints.iterdir()
                   if (m := _STEP_FOLDER.fullmatch(folder.name)))
    for _, folder in found[:-keep]:
        doomed = folder.with_name(f"{folder.name}{runs.TMP_MARK}pruned")
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
