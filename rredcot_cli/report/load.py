"""Reading finished training runs for ``rredcot report``.

What ``rredcot train`` leaves in each run dir (``train/summary.json``, ``metrics.parquet``,
``eval.parquet``, ``config.yaml``, ``manifest.json``) becomes one ``RunResult`` per run:

- ``load_run(path)``: one finished run (a run dir, or its train stage folder given directly), with
  its held-out pass@1 curve, final accuracy by chain length, tokens per step, the mean token
  advantage std, and, when the run dir has them, its credit-quality tables
  (``credit_quality.parquet``, ``judge/**/*.parquet``) and the seconds of its ``attribute*`` and
  ``sample`` stages;
- ``load_runs(paths, skip_unfinished)``: every run once, one ``RunError`` naming all unfinished or
  missing ones (``UnfinishedRunError`` marks the runs ``--skip-unfinished`` may leave out), and
  ``check_same_benchmark``: all runs on one benchmark.

The config-leaf helpers (``config_leaves``, ``same_value``, ``EXECUTION_KEYS``) live here because
the benchmark check needs them; ``rredcot_cli.report.compare`` groups runs with them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml
import pyarrow as pa
import pyarrow.parquet as pq

from rredcot_cli.store import artifacts, metrics_log, runs as run_files
from rredcot_cli.errors import ArtifactError, RunError
from rredcot_cli.metrics import accuracy_by_bucket
# Leaves that say how a run was executed, not what it computed, never split groups: the one rule
# that also leaves them out of a training run's hash.
from rredcot_cli.config.schema import EXECUTION_KEYS

TRAIN_FILES = ("manifest.json", "config.yaml", "summary.json", "metrics.parquet", "eval.parquet")


class UnfinishedRunError(RunError):
    """A run dir whose train stage did not finish (no train/ folder, a manifest not "complete",
    or missing files); ``rredcot report --skip-unfinished`` leaves such runs out."""


@dataclass
class RunResult:
    """One finished training run, as the report needs it."""

    path: Path  # the run dir (the folder holding train/)
    train_dir: Path
    method: str
    seed: int
    config: dict[str, Any]  # the resolved config.yaml of the train stage
    summary: dict[str, Any]  # summary.json
    curve: dict[int, float]  # step -> held-out pass@1 (0 = before training)
    by_length: dict[int, float]  # chain length -> final held-out accuracy (samples pooled)
    tokens_at: dict[int, int] = field(default_factory=dict)  # step -> generated tokens so far (0 -> 0)
    advantage_std: float | None = None  # mean over steps of the token-advantage std (None: not recorded)
    credit_quality: list[tuple[str, Any]] = field(default_factory=list)  # (file relative to path, pyarrow table)
    attribute_seconds: dict[str, float] = field(default_factory=dict)  # attribute folder -> seconds
    sample_seconds: float | None = None
    label: str = ""
    commit: str | None = None  # the git sha its manifest records (None: not recorded, so unknown)
    dirty: bool | None = None  # whether that checkout had uncommitted changes (None: unknown)
    # the CPU of each attempt, in order, without repeats ("AMD EPYC (AVX512)"); empty: not recorded
    machines: tuple[str, ...] = ()


# --------------------------------------------------------------------------- loading


def _train_dir(path: Path) -> tuple[Path, Path]:
    """``(run_dir, train_dir)`` for a run dir, or for a train stage folder given directly.
    Raises ``RunError`` naming the path and what is missing."""
    if not path.is_dir():
        raise RunError(f"{path}: no such run directory")
    own = run_files.read_manifest(path)
    if own is not None and own.get("stage") == "train":
        return path.parent, path
    train = path / "train"
    if not train.is_dir():
        tagged = sorted(p.name for p in path.glob("train-*") if p.is_dir())
        hint = f" (it has {', '.join(tagged)}: pass {path / tagged[0]} to use a tagged run)" if tagged else \
            f" (run `rredcot train run.dir={path}` first)"
        raise UnfinishedRunError(f"{path} has no finished train stage: no train/ folder{hint}")
    return path, train


def _check_finished(train: Path) -> None:
    missing = [name for name in TRAIN_FILES if not (train / name).exists()]  # metrics.parquet: a folder of parts
    manifest = run_files.read_manifest(train)
    if manifest is not None and manifest.get("status") != "complete":
        raise UnfinishedRunError(f"{train} is not a finished train stage: {train / 'manifest.json'} says status "
                                 f"{manifest.get('status')!r} (still running, or it stopped); finish or rerun it, "
                                 f"or pass --skip-unfinished")
    if missing:
        raise UnfinishedRunError(f"{train} is not a finished train stage: missing {', '.join(missing)}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is not readable JSON ({e})") from e


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ArtifactError(f"{path} is not readable YAML ({type(e).__name__})") from e
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} does not hold a config mapping")
    return data


def load_run(path: str | Path) -> RunResult:
    """Read one finished training run; ``RunError``/``ArtifactError`` say what is missing."""
    run_dir, train = _train_dir(Path(path))
    _check_finished(train)
    config = _read_yaml(train / "config.yaml")
    summary = _read_json(train / "summary.json")
    for key in ("eval_before", "eval_after"):
        if "pass@1" not in (summary.get(key) or {}):
            raise ArtifactError(f"{train / 'summary.json'} has no {key}['pass@1']")
    metrics = metrics_log.read(train / "metrics.parquet").to_pylist()
    eval_rows = artifacts.read_artifact("eval", train / "eval.parquet").to_pylist()

    curve = {0: float(summary["eval_before"]["pass@1"])}
    for row in metrics:
        if row["eval_accuracy"] is not None:
            curve[int(row["step"])] = float(row["eval_accuracy"])
    # Runs with train.eval_every=0 evaluate only at the end.
    curve.setdefault(int(summary.get("steps", max(curve))), float(summary["eval_after"]["pass@1"]))
    by_length = {int(k): v["accuracy"] for k, v in accuracy_by_bucket(eval_rows, key="steps").items()}

    tokens_at = {0: 0, **{int(row["step"]): int(row["tokens"]) for row in metrics}}
    result = RunResult(
        path=run_dir, train_dir=train, method=str(summary.get("method") or config["method"]["name"]),
        seed=int(config.get("seed", 0)), config=config, summary=summary, curve=curve, by_length=by_length,
        tokens_at=tokens_at, advantage_std=_mean_or_none([row.get("advantage_std") for row in metrics]),
    )
    manifest = run_files.read_manifest(train) or {}
    git = manifest.get("git") or {}
    result.commit, result.dirty = git.get("sha"), git.get("dirty")
    result.machines = machines_of(manifest)
    result.credit_quality = _credit_quality_tables(run_dir)
    result.attribute_seconds, result.sample_seconds = _stage_costs(run_dir)
    return result


def machines_of(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The CPUs a train stage's attempts ran on (its manifest's ``machine`` and each resumed
    attempt's), as ``cpu (capability)``, without repeats; attempts that recorded none are left out."""
    records = [manifest.get("machine"), *(attempt.get("machine") for attempt in manifest.get("resumed") or [])]
    labels = [f"{m.get('cpu') or 'unknown CPU'} ({m.get('torch_cpu_capability') or 'unknown'})"
              for m in records if m]
    return tuple(dict.fromkeys(labels))


def on_different_cpus(machines_a: tuple[str, ...], machines_b: tuple[str, ...]) -> bool:
    """Whether two runs, both with recorded CPUs (``machines_of``), did not all run on one kind."""
    return bool(machines_a and machines_b) and len(set(machines_a) | set(machines_b)) > 1


def machines_text(machines: tuple[str, ...]) -> str:
    """A run's CPUs as tables write them: one, ``A, then B`` for a run resumed elsewhere, or ``unknown``."""
    return ", then ".join(machines) or "unknown"


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _credit_quality_tables(run_dir: Path) -> list[tuple[str, Any]]:
    """Every ``credit_quality.parquet`` / ``judge/**/*.parquet`` table of a run dir."""
    files = [run_dir / "credit_quality.parquet"] if (run_dir / "credit_quality.parquet").is_file() else []
    judge = run_dir / "judge"
    if judge.is_dir():
        files += sorted(p for p in judge.rglob("*.parquet") if p.is_file() and run_files.TMP_MARK not in p.name)
    tables = []
    for file in files:
        try:
            with open(file, "rb") as handle:  # one open: a judge rewriting it mid-read cannot tear it
                tables.append((file.relative_to(run_dir).as_posix(), pq.read_table(handle)))
        except (pa.ArrowException, OSError) as e:
            raise ArtifactError(f"{file} is not a readable Parquet file ({e})") from e
    return tables


def _stage_costs(run_dir: Path) -> tuple[dict[str, float], float | None]:
    """Seconds of each finished ``attribute*/<method>`` stage and of the ``sample`` stage."""
    costs = {}
    for manifest_path in sorted(run_dir.glob("attribute*/*/manifest.json")):
        manifest = run_files.read_manifest(manifest_path.parent) or {}
        seconds = (manifest.get("extra") or {}).get("seconds")
        if manifest.get("status") == "complete" and seconds is not None:
            costs[manifest_path.parent.relative_to(run_dir).as_posix()] = float(seconds)
    sample = run_files.read_manifest(run_dir / "sample") or {}
    sample_seconds = (sample.get("extra") or {}).get("seconds") if sample.get("status") == "complete" else None
    return costs, (float(sample_seconds) if sample_seconds is not None else None)


def load_runs(paths: Sequence[str | Path], skip_unfinished: bool = False,
              skipped: list[Path] | None = None) -> list[RunResult]:
    """Load every run (each path once); one ``RunError`` lists all unfinished or missing ones.

    With ``skip_unfinished`` a run dir whose train stage did not finish is left out and appended
    to ``skipped`` instead (a path that does not exist is still an error); ``RunError`` when no
    finished run is left."""
    if not paths:
        raise RunError("no run directories given")
    seen, unique = set(), []
    for p in paths:
        if Path(p).resolve() not in seen:
            seen.add(Path(p).resolve())
            unique.append(Path(p))
    results, problems, left_out = [], [], []
    for p in unique:
        try:
            results.append(load_run(p))
        except UnfinishedRunError as e:
            if skip_unfinished:
                left_out.append(p)
            else:
                problems.append(str(e))
        except RunError as e:
            problems.append(str(e))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise RunError("; ".join(problems[:3]) + more)
    if skipped is not None:
        skipped.extend(left_out)
    if not results:
        raise RunError(f"none of the {len(unique)} run dir(s) has a finished train stage "
                       f"({', '.join(map(str, left_out[:3]))}{', ...' if len(left_out) > 3 else ''}); nothing to report")
    check_same_benchmark(results)
    return results



# --------------------------------------------------------------------------- config leaves


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        found = {}
        for key, sub in value.items():
            found.update(_leaves(sub, f"{prefix}.{key}"))
        return found
    return {prefix: value}


def config_leaves(config: dict[str, Any], groups: Sequence[str]) -> dict[str, Any]:
    found = {}
    for group in groups:
        if group in config:
            found.update(_leaves(config[group], group))
    return {k: v for k, v in found.items() if k not in EXECUTION_KEYS}


def same_value(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def check_same_benchmark(results: Sequence[RunResult]) -> None:
    """``RunError`` naming two runs and the benchmark options they differ in."""
    first = results[0]
    reference = config_leaves(first.config, ["benchmark"])
    for other in results[1:]:
        leaves = config_leaves(other.config, ["benchmark"])
        differing = [k for k in sorted(set(reference) | set(leaves))
                     if not same_value(reference.get(k), leaves.get(k))]
        if differing:
            shown = ", ".join(f"{k}={reference.get(k)} vs {leaves.get(k)}" for k in differing[:3])
            raise RunError(f"the runs mix benchmarks: {first.path} and {other.path} differ in {shown}; "
                           "compare runs on one benchmark (same benchmark options) at a time")
