"""Experiment trackers: each training step's metrics, sent through the tracker's own library.

``tracking=[tensorboard,wandb,trackio,mlflow]`` (any subset) on ``rredcot train``. Every
tracker gets the resolved config once, a run id that stays the same when the run is resumed
(``train.resume=true`` continues the same tracker run where the library can), and then
``log(metrics, step)`` for every finished step. The loop sees only ``Trackers``; everything
specific to one library is in its adapter below, and each library is imported only when chosen.

Where they write, with no network needed:

- tensorboard: ``<train dir>/tensorboard/`` (``tensorboard --logdir RUN/train/tensorboard``);
- wandb: ``<train dir>/wandb/``, online unless ``WANDB_MODE=offline`` (then ``wandb sync`` later);
  project ``WANDB_PROJECT`` or ``rredcot``;
- trackio: its local store, ``<train dir>/trackio/`` unless ``TRACKIO_DIR`` is set; a Hugging
  Face Space only if ``TRACKIO_SPACE_ID`` is set; project ``TRACKIO_PROJECT`` or ``rredcot``;
- mlflow: ``MLFLOW_TRACKING_URI`` when set, else a local database, ``<train dir>/mlflow.db``;
  experiment ``MLFLOW_EXPERIMENT_NAME`` or ``rredcot``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable
import hashlib

import yaml

from rredcot_cli.errors import RredcotError, full_disk_errno, storage_error

# tracker name -> the module it needs (its pip extra is the tracker's name)
LIBRARIES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
DEFAULT_PROJECT = "rredcot"


class TrackingError(RredcotError):
    """A tracker that is unknown, not installed or failed to start; the message is one line."""


def check(names: list[str]) -> list[str]:
    """``names`` without duplicates, refusing an unknown or uninstalled tracker in one line
    (before any model loads)."""
    chosen = list(dict.fromkeys(names))
    for name in chosen:
        if name not in LIBRARIES:
            raise TrackingError(f"tracking=[{','.join(names)}]: unknown tracker {name!r}; "
                                f"valid: {', '.join(LIBRARIES)}")
        if importlib.util.find_spec(LIBRARIES[name]) is None:
            raise TrackingError(f"tracking: {name} is not installed; pip install \"rredcot[{name}]\"")
    return chosen


def run_id(train_dir: Path, created: str) -> str:
    """An id for the trackers that stays the same when this train folder's attempt (made at
    ``created``) is resumed."""
    return hashlib.sha256(f"{Path(train_dir).resolve()}|{created}".encode()).hexdigest()[:12]


class Trackers:
    """The chosen trackers as one: ``log(metrics, step)`` and ``close()``; no trackers: no-ops.
    A tracker whose local store cannot be written for want of space (its library's error says so)
    stops the run with a one-line ``StorageError`` naming ``folder`` (the train folder its store is in)."""

    def __init__(self, adapters: list[Any], folder: Path | None = None) -> None:
        self._adapters = adapters
        self._folder = folder

    def log(self, metrics: dict[str, Any], step: int) -> None:
        scalars = {k: float(v) for k, v in metrics.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(float(v))}
        for adapter in self._adapters:
            with self._full_disk_is_one_line(adapter):
                adapter.log(scalars, step)

    def close(self) -> None:
        adapters, self._adapters = self._adapters, []
        for adapter in adapters:
            with self._full_disk_is_one_line(adapter):
                adapter.close()

    @contextlib.contextmanager
    def _full_disk_is_one_line(self, adapter: Any):
        try:
            yield
        except Exception as e:
            if full_disk_errno(e) is None:
                raise
            _quiet_full_disk_in_threads()  # the library's writer thread fails the same way: one line is enough
            with contextlib.suppress(Exception):
                adapter.close()
            self._adapters = [a for a in self._adapters if a is not adapter]
            name = next((n for n, cls in _ADAPTERS.items() if isinstance(adapter, cls)), type(adapter).__name__)
            where = f"the {name} store in {self._folder}" if self._folder else f"the {name} store"
            free = shutil.disk_usage(self._folder).free if self._folder and self._folder.exists() else None
            raise storage_error(e, where, writing=True, free=free) from e


def _quiet_full_disk_in_threads() -> None:
    """From now on a background thread that dies of a full disk (tensorboard's event writer) prints
    nothing: the run is stopping with a one-line error saying so."""
    previous = threading.excepthook

    def hook(args) -> None:  # noqa: ANN001 - threading.ExceptHookArgs
        if args.exc_value is None or full_disk_errno(args.exc_value) is None:
            previous(args)

    threading.excepthook = hook


def open_trackers(names: list[str], folder: Path, *, config: dict, run_id: str, run_name: str) -> Trackers:
    """Start the trackers ``names`` (already ``check``-ed) for the run in ``folder`` (the train
    stage folder), each given ``config`` (a plain dict) and the run's id and name."""
    adapters = []
    try:
        for name in names:
            adapters.append(_ADAPTERS[name](Path(folder), config, run_id, run_name))
    except ImportError as e:
        Trackers(adapters).close()
        raise TrackingError(f"tracking: {name} cannot be imported ({e}); pip install \"rredcot[{name}]\"") from e
    return Trackers(adapters, Path(folder))


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-5}}`` -> ``{"train.lr": 1e-5}``; lists become their text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat


# --------------------------------------------------------------------------- adapters


class _TensorBoard:
    def __init__(self, folder: Path, config: dict, run_id: str, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional dependency: the tensorboard package

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        self.writer.add_text("run_id", run_id)
        self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```")

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(f"train/{key}", value, global_step=step)
        self.writer.flush()  # a reader sees each step as it ends

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, folder: Path, config: dict, run_id: str, run_name: str) -> None:
        import wandb  # optional dependency: the chosen tracker's package

        self.wandb = wandb
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), name=run_name, id=run_id,
                              resume="allow", dir=str(folder), config=config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, folder: Path, config: dict, run_id: str, run_name: str) -> None:
        # trackio reads its store's location when it is imported
        os.environ.setdefault("TRACKIO_DIR", str(folder / "trackio"))
        import trackio  # optional dependency: the chosen tracker's package

        self.trackio = trackio
        self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", DEFAULT_PROJECT), name=f"{run_name}-{run_id}",
                                config=config, resume="allow", space_id=os.environ.get("TRACKIO_SPACE_ID"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.trackio.log({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.trackio.finish()


class _Mlflow:
    def __init__(self, folder: Path, config: dict, run_id: str, run_name: str) -> None:
        import mlflow  # optional dependency: the chosen tracker's package

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # a local database (mlflow's file store is deprecated)
            folder.mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{(folder / 'mlflow.db').resolve()}")
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT))
        # The same rredcot run (a resume) continues the mlflow run tagged with its id.
        found = mlflow.search_runs(filter_string=f"tags.rredcot_run_id = '{run_id}'", output_format="list")
        if found:
            mlflow.start_run(run_id=found[0].info.run_id)
        else:
            mlflow.start_run(run_name=run_name, tags={"rredcot_run_id": run_id})
            mlflow.log_params(flatten(config))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({f"train/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


_ADAPTERS: dict[str, Callable[..., Any]] = {"tensorboard": _TensorBoard, "wandb": _Wandb, "trackio": _Trackio,
                                            "mlflow": _Mlflow}
