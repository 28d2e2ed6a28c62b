"""Side-by-side comparison of finished training runs (``rredcot report``).

Reads what ``rredcot train`` leaves in each run dir (``train/summary.json``, ``metrics.parquet``,
``eval.parquet``, ``config.yaml``, ``manifest.json``), groups the runs by method and by every
other option that differs between them (seeds are what varies inside a group), and aggregates
over seeds with 95% Student-t intervals (``rredcot_cli.metrics.mean_ci``):

- held-out pass@1 against the training step (step 0 is the eval before training);
- final held-out accuracy by chain length (``steps`` of synthetic problems);
- final pass@1, pass@k, maj@k, the change in pass@1 from before training, wall time and
  generated tokens;
- credit quality, from ``credit_quality.parquet`` / ``judge/**/*.parquet`` in a run dir when
  there are any (read generically: every numeric column averaged per run, then over runs), and
  the cost of ``rredcot attribute`` on saved traces when its manifests are there.

``build_report(paths)`` loads and aggregates; ``write_report(report, out_dir)`` writes
``report.md``, ``report.csv``, ``final_accuracy.png``, ``accuracy_vs_step.png`` and ``accuracy_by_length.png`` (plus
``credit_quality.csv`` when there are credit-quality results), each atomically.
matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rredcot_cli import runs as run_files
from rredcot_cli.errors import ArtifactError, RunError
from rredcot_cli.metrics import accuracy_by_bucket, mean_ci

CONFIDENCE = 0.95
# Config groups that decide what a training run computes (train's config keys, without seed).
GROUPING_KEYS = ("model", "backend", "benchmark", "segment", "method", "sampling", "train", "critic")
# Leaves that say how a run was executed, not what it computed: never split groups.
IGNORED_LEAVES = {"train.resume", "train.max_nonfinite_updates", "train.save_every", "backend.num_threads",
                  "benchmark.verify_timeout_s", "train.micro_batch_size", "train.logprob_chunk_tokens",
                  "train.gradient_checkpointing", "backend.kv_cache_gb", "backend.max_model_len",
                  "backend.sleep_mode", "train.parallel", "train.dist_timeout_s"}
TRAIN_FILES = ("manifest.json", "config.yaml", "summary.json", "metrics.parquet", "eval.parquet")
# Credit-quality files: columns that identify rows rather than measure anything.
ID_COLUMNS = {"prompt_id", "sample_idx", "segment_idx", "step", "seed", "batch"}
MAX_KEY_VALUES = 20  # a string column with more distinct values is an id, not a key


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


@dataclass
class Stat:
    """A mean over runs with its confidence interval (NaN bounds with fewer than two runs)."""

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Stat":
        mean, low, high = mean_ci(list(values), CONFIDENCE)
        return cls(mean, low, high, len(values))

    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, digits: int = 3) -> str:
        """``0.712 ± 0.041``, or ``0.712`` when there is no interval."""
        if math.isnan(self.low):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width():.{digits}f}"


@dataclass
class GroupSummary:
    label: str
    method: str
    runs: list[RunResult]
    k: int  # the largest k with pass@k / maj@k in every run's final eval
    pass1: Stat
    pass1_before: Stat
    delta_pass1: Stat
    pass_k: Stat
    maj_k: Stat
    seconds: Stat
    generated_tokens: Stat
    curve: dict[int, Stat]  # steps every run evaluated
    by_length: dict[int, Stat]  # chain lengths every run's final eval has

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.runs)


@dataclass
class Report:
    runs: list[RunResult]
    groups: list[GroupSummary]
    benchmark: dict[str, Any]
    credit_quality: list[dict[str, Any]]  # rows: group, source, key columns, measures (Stat)
    credit_quality_columns: dict[str, tuple[list[str], list[str]]]  # source -> (key columns, measures)
    attribute_costs: list[dict[str, Any]]
    skipped: list[Path] = field(default_factory=list)  # run dirs left out: train did not finish
    baseline: str | None = None  # the group the paired section compares against
    paired: list["PairedRow"] = field(default_factory=list)


@dataclass
class PairedRow:
    """One group against the baseline group, over the seeds both have (see ``paired_summary``)."""

    label: str
    seeds: list[int]
    difference: Stat  # final pass@1 minus the baseline's, same seed
    target: float  # the baseline's mean final pass@1
    reached: int  # runs whose held-out pass@1 reached ``target`` at some eval
    runs: int
    steps_to_target: Stat | None  # over the runs that reached it
    tokens_to_target: Stat | None


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
    missing = [name for name in TRAIN_FILES if not (train / name).is_file()]
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
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ArtifactError(f"{path} is not readable YAML ({type(e).__name__})") from e
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} does not hold a config mapping")
    return data


def load_run(path: str | Path) -> RunResult:
    """Read one finished training run; ``RunError``/``ArtifactError`` say what is missing."""
    from rredcot_cli import artifacts

    run_dir, train = _train_dir(Path(path))
    _check_finished(train)
    config = _read_yaml(train / "config.yaml")
    summary = _read_json(train / "summary.json")
    for key in ("eval_before", "eval_after"):
        if "pass@1" not in (summary.get(key) or {}):
            raise ArtifactError(f"{train / 'summary.json'} has no {key}['pass@1']")
    metrics = artifacts.read_artifact("train_metrics", train / "metrics.parquet").to_pylist()
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
    result.credit_quality = _credit_quality_tables(run_dir)
    result.attribute_seconds, result.sample_seconds = _stage_costs(run_dir)
    return result


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _credit_quality_tables(run_dir: Path) -> list[tuple[str, Any]]:
    """Every ``credit_quality.parquet`` / ``judge/**/*.parquet`` table of a run dir."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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


# --------------------------------------------------------------------------- grouping


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        found = {}
        for key, sub in value.items():
            found.update(_leaves(sub, f"{prefix}.{key}"))
        return found
    return {prefix: value}


def _config_leaves(config: dict[str, Any], groups: Sequence[str]) -> dict[str, Any]:
    found = {}
    for group in groups:
        if group in config:
            found.update(_leaves(config[group], group))
    return {k: v for k, v in found.items() if k not in IGNORED_LEAVES}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def check_same_benchmark(results: Sequence[RunResult]) -> None:
    """``RunError`` naming two runs and the benchmark options they differ in."""
    first = results[0]
    reference = _config_leaves(first.config, ["benchmark"])
    for other in results[1:]:
        leaves = _config_leaves(other.config, ["benchmark"])
        differing = [k for k in sorted(set(reference) | set(leaves)) if not _same(reference.get(k), leaves.get(k))]
        if differing:
            shown = ", ".join(f"{k}={reference.get(k)} vs {leaves.get(k)}" for k in differing[:3])
            raise RunError(f"the runs mix benchmarks: {first.path} and {other.path} differ in {shown}; "
                           "compare runs on one benchmark (same benchmark options) at a time")


def _varying(results: Sequence[RunResult], keys_of) -> set[str]:  # noqa: ANN001 - a function
    """Leaves whose value is not the same in every run that has them."""
    values: dict[str, list[Any]] = {}
    for r in results:
        for key, value in keys_of(r).items():
            values.setdefault(key, []).append(value)
    return {k for k, vs in values.items() if any(not _same(vs[0], v) for v in vs[1:])}


def _schema_defaults(groups: Sequence[str]) -> dict[str, Any]:
    """Leaves of the schema's defaults under ``groups``: the value an option had in runs made
    before it existed (their config.yaml lacks it)."""
    from omegaconf import OmegaConf

    from rredcot_cli.schema import Config

    return _config_leaves(OmegaConf.to_container(OmegaConf.structured(Config), resolve=False), groups)


# Method options added after runs were made without them, with the value those runs ran with
# (not today's default where the default changed with the option): rredcot's window was counted in
# tokens until is_window_unit arrived; segments became the default later.
METHOD_OPTIONS_ADDED_LATER = {"rredcot": {"method.is_window_unit": "tokens"}}


def _method_leaves(r: RunResult) -> dict[str, Any]:
    return {**METHOD_OPTIONS_ADDED_LATER.get(r.method, {}), **_config_leaves(r.config, ["method"])}


def assign_labels(results: Sequence[RunResult]) -> None:
    """Label each run ``method`` plus the options that set it apart (``rredcot · segment.name=fixed``).

    Non-method options count when they differ anywhere in the set (an option missing from an older
    run's config has its default); a run's label shows those where it is not at the default, or
    where no run is. ``method.*`` parameters count when they differ between runs of the same
    method (methods have different parameters anyway) and are always shown; a method option an
    older run lacks has the value it ran with (``METHOD_OPTIONS_ADDED_LATER``).
    """
    others = [g for g in GROUPING_KEYS if g != "method"]
    defaults = _schema_defaults(others)

    def shared_leaves(r: RunResult) -> dict[str, Any]:
        return {**defaults, **_config_leaves(r.config, others)}

    shared = _varying(results, shared_leaves)
    nobody_default = {k for k in shared if k not in defaults
                      or not any(_same(shared_leaves(r)[k], defaults[k]) for r in results)}
    by_method: dict[str, set[str]] = {}
    for method in {r.method for r in results}:
        same_method = [r for r in results if r.method == method]
        by_method[method] = _varying(same_method, _method_leaves) - {"method.name"}
    for r in results:
        method_leaves = _method_leaves(r)
        leaves = shared_leaves(r)
        shown = [(k, method_leaves[k]) for k in sorted(by_method[r.method] & set(method_leaves))]
        shown += [(k, leaves[k]) for k in sorted(shared & set(leaves))
                  if k in nobody_default or not _same(leaves[k], defaults[k])]
        r.label = r.method + "".join(f" · {k}={v}" for k, v in shown)


# --------------------------------------------------------------------------- aggregation


def _largest_k(results: Sequence[RunResult]) -> int:
    common = None
    for r in results:
        ks = {int(key.split("@")[1]) for key in r.summary["eval_after"] if key.startswith("pass@")}
        ks &= {int(key.split("@")[1]) for key in r.summary["eval_after"] if key.startswith("maj@")}
        common = ks if common is None else common & ks
    return max(common or {1})


def summarize_group(label: str, results: list[RunResult]) -> GroupSummary:
    k = _largest_k(results)
    after = [r.summary["eval_after"] for r in results]
    before = [r.summary["eval_before"] for r in results]
    steps = set.intersection(*(set(r.curve) for r in results))
    lengths = set.intersection(*(set(r.by_length) for r in results))
    return GroupSummary(
        label=label, method=results[0].method, runs=sorted(results, key=lambda r: (r.seed, str(r.path))), k=k,
        pass1=Stat.of([a["pass@1"] for a in after]),
        pass1_before=Stat.of([b["pass@1"] for b in before]),
        delta_pass1=Stat.of([a["pass@1"] - b["pass@1"] for a, b in zip(after, before)]),
        pass_k=Stat.of([a[f"pass@{k}"] for a in after]),
        maj_k=Stat.of([a[f"maj@{k}"] for a in after]),
        seconds=Stat.of([float(r.summary.get("seconds", math.nan)) for r in results]),
        generated_tokens=Stat.of([float(r.summary.get("generated_tokens", math.nan)) for r in results]),
        curve={s: Stat.of([r.curve[s] for r in results]) for s in sorted(steps)},
        by_length={n: Stat.of([r.by_length[n] for r in results]) for n in sorted(lengths)},
    )


def _is_numeric(type_) -> bool:  # noqa: ANN001 - a pyarrow type
    import pyarrow as pa

    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)


def _is_text(type_) -> bool:  # noqa: ANN001 - a pyarrow type
    import pyarrow as pa

    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_dictionary(type_)


def credit_quality_summary(groups: Sequence[GroupSummary]):
    """Rows of the credit-quality table and, per source file, its (key columns, measure columns).

    Key columns are the text columns with few distinct values (e.g. the method judged); measures
    are the numeric columns (booleans as fractions). Each run contributes the mean of its rows per
    key; the row shows the mean (and interval) of those over the group's runs.
    """
    columns: dict[str, tuple[list[str], list[str]]] = {}
    per_run: dict[tuple[str, str, tuple], dict[str, list[float]]] = {}
    for group in groups:
        for run in group.runs:
            for source, table in run.credit_quality:
                keys = [f.name for f in table.schema if _is_text(f.type) and f.name not in ID_COLUMNS
                        and len(set(table.column(f.name).to_pylist())) <= MAX_KEY_VALUES]
                measures = [f.name for f in table.schema if _is_numeric(f.type) and f.name not in ID_COLUMNS]
                known_keys, known_measures = columns.get(source, ([], []))
                columns[source] = (known_keys + [c for c in keys if c not in known_keys],
                                   known_measures + [c for c in measures if c not in known_measures])
                rows = table.select(keys + measures).to_pylist()
                buckets: dict[tuple, list[dict]] = {}
                for row in rows:
                    buckets.setdefault(tuple((c, row[c]) for c in keys), []).append(row)
                for key, bucket in buckets.items():
                    target = per_run.setdefault((group.label, source, key), {})
                    for m in measures:
                        values = [float(row[m]) for row in bucket if row[m] is not None]
                        if values:
                            target.setdefault(m, []).append(sum(values) / len(values))
    result = []
    for (label, source, key), measures in per_run.items():
        result.append({"group": label, "source": source, **dict(key),
                       **{m: Stat.of(values) for m, values in measures.items()}})
    return result, columns


def attribute_cost_summary(groups: Sequence[GroupSummary]) -> list[dict[str, Any]]:
    """Seconds of each ``rredcot attribute`` folder found in the runs, and relative to sampling."""
    rows = []
    for group in groups:
        folders = sorted({f for r in group.runs for f in r.attribute_seconds})
        for folder in folders:
            runs_with = [r for r in group.runs if folder in r.attribute_seconds]
            ratios = [r.attribute_seconds[folder] / r.sample_seconds for r in runs_with if r.sample_seconds]
            rows.append({"group": group.label, "attribute": folder,
                         "seconds": Stat.of([r.attribute_seconds[folder] for r in runs_with]),
                         "relative_to_sampling": Stat.of(ratios) if ratios else None})
    return rows


def _first_reach(run: RunResult, target: float) -> int | None:
    """The first evaluated step (0 = before training) whose held-out pass@1 is >= ``target``."""
    return next((step for step in sorted(run.curve) if run.curve[step] >= target - 1e-12), None)


def paired_summary(groups: Sequence[GroupSummary], baseline: str) -> list[PairedRow]:
    """Every group (the baseline included, as its own yardstick) against ``baseline``: the
    difference in final pass@1 over the seeds both groups ran (mean and interval of the per-seed
    differences; the interval's half-width is the smallest difference this design resolves), and
    sample efficiency: the policy updates and generated tokens a run needed to reach the
    baseline's mean final pass@1, at the resolution of its held-out evals."""
    base = next(g for g in groups if g.label == baseline)
    target = base.pass1.mean
    by_seed = {r.seed: r for r in base.runs}
    out = []
    for g in groups:
        mine = {r.seed: r for r in g.runs}
        seeds = sorted(set(mine) & set(by_seed))
        diffs = [mine[s].summary["eval_after"]["pass@1"] - by_seed[s].summary["eval_after"]["pass@1"] for s in seeds]
        reach = [(r, _first_reach(r, target)) for r in g.runs]
        reach = [(r, step) for r, step in reach if step is not None]
        steps = [step for _, step in reach]
        tokens = [r.tokens_at[step] for r, step in reach if step in r.tokens_at]
        out.append(PairedRow(
            label=g.label, seeds=seeds, difference=Stat.of(diffs) if diffs else Stat(math.nan, math.nan, math.nan, 0),
            target=target, reached=len(reach), runs=len(g.runs),
            steps_to_target=Stat.of(steps) if steps else None,
            tokens_to_target=Stat.of(tokens) if len(tokens) == len(steps) and tokens else None))
    return out


def default_baseline(groups: Sequence[GroupSummary]) -> str | None:
    """``grpo`` when a group has that label (GRPO with nothing changed), else none."""
    return "grpo" if any(g.label == "grpo" for g in groups) else None


def build_report(paths: Sequence[str | Path], skip_unfinished: bool = False, baseline: str | None = None) -> Report:
    """Load, group and aggregate the runs at ``paths`` (``skip_unfinished``: leave out run dirs
    whose train stage did not finish, listed in ``Report.skipped``). ``baseline``: the group label
    the paired section compares against (default: ``grpo`` when present)."""
    skipped: list[Path] = []
    results = load_runs(paths, skip_unfinished=skip_unfinished, skipped=skipped)
    assign_labels(results)
    grouped: dict[str, list[RunResult]] = {}
    for r in results:
        grouped.setdefault(r.label, []).append(r)
    groups = [summarize_group(label, grouped[label]) for label in sorted(grouped)]
    quality, quality_columns = credit_quality_summary(groups)
    if baseline is None:
        baseline = default_baseline(groups)
    elif baseline not in grouped:
        raise RunError(f"--baseline {baseline!r} is not a group of these runs; groups: "
                       f"{', '.join(g.label for g in groups)}")
    return Report(runs=results, groups=groups, benchmark=results[0].config.get("benchmark", {}),
                  credit_quality=quality, credit_quality_columns=quality_columns,
                  attribute_costs=attribute_cost_summary(groups), skipped=skipped, baseline=baseline,
                  paired=paired_summary(groups, baseline) if baseline is not None and len(groups) > 1 else [])


# --------------------------------------------------------------------------- tables


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _seeds_text(group: GroupSummary) -> str:
    return f"{len(group.runs)} ({', '.join(str(s) for s in group.seeds)})"


def _signed(stat: Stat) -> str:
    text = stat.text()
    return text if text.startswith("-") else "+" + text


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The main table as text cells (shared by report.md and the terminal table). With one k
    for every group the header names it (pass@8); otherwise each cell does."""
    ks = {g.k for g in report.groups}
    k_header = str(ks.pop()) if len(ks) == 1 else "k"
    header = ["method", "seeds", "pass@1", "Δ pass@1", f"pass@{k_header}", f"maj@{k_header}", "wall s",
              "generated tokens"]
    rows = []
    for g in report.groups:
        k_cell = "" if k_header != "k" else f" (k={g.k})"
        rows.append([g.label, _seeds_text(g), g.pass1.text(), _signed(g.delta_pass1),
                     g.pass_k.text() + k_cell, g.maj_k.text() + k_cell, g.seconds.text(0), g.generated_tokens.text(0)])
    return header, rows


def render_markdown(report: Report) -> str:
    b = report.benchmark
    first = report.runs[0].summary["eval_after"]
    steps_range = f", chain length {b['min_steps']}–{b['max_steps']}" if b.get("min_steps") is not None else ""
    parts = [
        "# rredcot comparison report",
        f"{len(report.runs)} training runs in {len(report.groups)} groups on benchmark `{b.get('name')}` "
        f"(held-out split `{b.get('eval_split')}`{steps_range}; final eval of the first run: "
        f"{first.get('num_problems')} problems × {first.get('n')} samples). "
        "Runs are grouped by method and by every option that differs between them; seeds vary within a "
        f"group. `±` is the half-width of a {CONFIDENCE:.0%} Student-t interval over seeds "
        "(none with one seed).",
        "## Final held-out accuracy",
        "![final held-out pass@1](final_accuracy.png)",
        _md_table(*summary_rows(report)),
        "pass@1 is the mean over problems of the fraction of correct samples; pass@k is unbiased; "
        "maj@k is majority voting over the first k samples. Δ pass@1 is after minus before training, per run. "
        "Wall seconds and generated tokens cover the whole `rredcot train` run (held-out evals included "
        "in the seconds, training rollouts only in the tokens).",
    ]
    if report.paired:
        parts += [f"## Paired against {report.baseline}", _paired_markdown(report)]
    parts += [
        "## Held-out accuracy vs policy updates",
        "![held-out pass@1 vs step](accuracy_vs_step.png)",
    ]
    steps = sorted({s for g in report.groups for s in g.curve})
    parts.append(_md_table(["step"] + [g.label for g in report.groups],
                           [[s] + [g.curve[s].text() if s in g.curve else "" for g in report.groups] for s in steps]))
    parts.append("Step 0 is the held-out eval before training; a step is one batch of rollouts and its "
                 "policy updates.")
    parts += ["## Final accuracy by chain length", "![accuracy by chain length](accuracy_by_length.png)"]
    lengths = sorted({n for g in report.groups for n in g.by_length})
    if lengths:
        parts.append(_md_table(["chain length"] + [g.label for g in report.groups],
                               [[n] + [g.by_length[n].text() if n in g.by_length else "" for g in report.groups]
                                for n in lengths]))
        parts.append("Per run, the fraction of correct samples among the final eval's problems of that length; "
                     "then mean and interval over seeds.")
    else:
        parts.append("The eval rows have no chain length (`steps`), so there is no breakdown by length.")
    if any(r.advantage_std is not None for r in report.runs):
        parts += ["## Advantages", _advantages_markdown(report)]
    parts += ["## Credit quality", _credit_quality_markdown(report)]
    parts += ["## Cost", _cost_markdown(report)]
    parts += ["## Runs", _md_table(
        ["run dir", "group", "seed", "steps", "pass@1 before", "pass@1 after", "wall s", "generated tokens"],
        [[str(r.path), r.label, r.seed, r.summary.get("steps", ""), f"{r.summary['eval_before']['pass@1']:.3f}",
          f"{r.summary['eval_after']['pass@1']:.3f}", f"{float(r.summary.get('seconds', math.nan)):.0f}",
          r.summary.get("generated_tokens", "")]
         for g in report.groups for r in g.runs])]
    if report.skipped:
        parts.append(f"Left out (`--skip-unfinished`; their train stage did not finish): "
                     f"{', '.join(f'`{p}`' for p in report.skipped)}.")
    return "\n\n".join(parts) + "\n"


def _advantages_markdown(report: Report) -> str:
    rows = []
    for g in report.groups:
        values = [r.advantage_std for r in g.runs if r.advantage_std is not None]
        rows.append([g.label, Stat.of(values).text() if len(values) == len(g.runs) else "—"])
    return "\n\n".join([
        _md_table(["method", "token advantage std"], rows),
        "Per step, the standard deviation of the token advantages over the batch's completion tokens; "
        "its mean over the run's steps, then over seeds (— where a run predates the column). How "
        "spread the update's signal is, not how right it is (credit quality measures that).",
    ])


def _paired_markdown(report: Report) -> str:
    target = report.paired[0].target
    rows = []
    for row in report.paired:
        is_base = row.label == report.baseline
        diff = "—" if is_base else (f"{row.difference.mean:+.3f} [{row.difference.low:+.3f}, {row.difference.high:+.3f}]"
                                    if not math.isnan(row.difference.low) else
                                    (f"{row.difference.mean:+.3f}" if row.difference.n else "no common seed"))
        resolves = "—" if is_base or math.isnan(row.difference.low) else f"± {row.difference.half_width():.3f}"
        rows.append([row.label, ", ".join(map(str, row.seeds)), diff, resolves, f"{row.reached}/{row.runs}",
                     row.steps_to_target.text(1) if row.steps_to_target else "—",
                     row.tokens_to_target.text(0) if row.tokens_to_target else "—"])
    return "\n\n".join([
        _md_table(["method", "seeds", f"Δ final pass@1 vs {report.baseline} (same seed)", "resolves",
                   f"reached {target:.3f}", "policy updates to reach it", "generated tokens to reach it"], rows),
        f"Δ is the mean of the per-seed differences with its {CONFIDENCE:.0%} Student-t interval; \"resolves\" is "
        "that interval's half-width, the smallest difference this many paired seeds can tell from zero. "
        f"Sample efficiency: the first held-out eval at which a run's pass@1 reached {report.baseline}'s mean "
        f"final pass@1 ({target:.3f}), in policy updates (steps) and generated training tokens up to that step, "
        "over the runs that reached it; its resolution is the eval interval (`train.eval_every`). "
        f"The {report.baseline} row is the baseline measured against its own mean.",
    ])


def _credit_quality_markdown(report: Report) -> str:
    if not report.credit_quality:
        return ("No credit-quality results in these run dirs (looked for `credit_quality.parquet` and "
                "`judge/**/*.parquet`).")
    parts = []
    for source, (keys, measures) in report.credit_quality_columns.items():
        rows = [row for row in report.credit_quality if row["source"] == source]
        parts.append(f"From `{source}` (mean per run, then over the group's runs):")
        parts.append(_md_table(["method (run group)"] + keys + measures,
                               [[row["group"]] + [row.get(k, "") for k in keys]
                                + [row[m].text() if m in row else "" for m in measures] for row in rows]))
    return "\n\n".join(parts)


def _cost_markdown(report: Report) -> str:
    rows = []
    for g in report.groups:
        steps = [float(r.summary.get("steps") or math.nan) for r in g.runs]
        per_step = Stat.of([float(r.summary.get("seconds", math.nan)) / s for r, s in zip(g.runs, steps)])
        tokens_per_s = Stat.of([float(r.summary.get("generated_tokens", math.nan)) / float(r.summary.get("seconds", math.nan))
                                for r in g.runs])
        cpu = [float(r.summary["cpu_seconds"]) for r in g.runs if "cpu_seconds" in r.summary]
        cpu_text = Stat.of(cpu).text(0) if len(cpu) == len(g.runs) else "—"
        rows.append([g.label, g.seconds.text(0), cpu_text, per_step.text(2), g.generated_tokens.text(0),
                     tokens_per_s.text(0)])
    parts = [_md_table(["method", "wall s", "CPU s", "s per step", "generated tokens", "generated tokens per wall s"],
                       rows)]
    parts.append("CPU s: the train process's CPU time, every thread (an in-process vLLM engine included); "
                 "— for runs written before it was recorded.")
    if report.attribute_costs:
        parts.append("`rredcot attribute` on the saved traces of these run dirs:")
        parts.append(_md_table(["method (run group)", "attribute folder", "seconds", "× sample stage seconds"],
                               [[row["group"], row["attribute"], row["seconds"].text(2),
                                 row["relative_to_sampling"].text(2) if row["relative_to_sampling"] else "no sample stage"]
                                for row in report.attribute_costs]))
    return "\n\n".join(parts)


def _num(x: float) -> str:
    return "" if x is None or math.isnan(x) else repr(float(x))


CSV_HEADER = [
    "group", "method", "n_seeds", "seeds", "k",
    "pass@1_mean", "pass@1_ci_low", "pass@1_ci_high", "pass@1_before_mean",
    "delta_pass@1_mean", "delta_pass@1_ci_low", "delta_pass@1_ci_high",
    "pass@k_mean", "pass@k_ci_low", "pass@k_ci_high", "maj@k_mean", "maj@k_ci_low", "maj@k_ci_high",
    "seconds_mean", "generated_tokens_mean", "run_dirs",
]


def render_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for g in report.groups:
        writer.writerow([
            g.label, g.method, len(g.runs), " ".join(str(s) for s in g.seeds), g.k,
            _num(g.pass1.mean), _num(g.pass1.low), _num(g.pass1.high), _num(g.pass1_before.mean),
            _num(g.delta_pass1.mean), _num(g.delta_pass1.low), _num(g.delta_pass1.high),
            _num(g.pass_k.mean), _num(g.pass_k.low), _num(g.pass_k.high),
            _num(g.maj_k.mean), _num(g.maj_k.low), _num(g.maj_k.high),
            _num(g.seconds.mean), _num(g.generated_tokens.mean), " ".join(str(r.path) for r in g.runs),
        ])
    return buffer.getvalue()


def render_credit_quality_csv(report: Report) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["group", "source", "keys", "measure", "n_runs", "mean", "ci_low", "ci_high"])
    for row in report.credit_quality:
        keys, measures = report.credit_quality_columns[row["source"]]
        key_text = " ".join(f"{k}={row[k]}" for k in keys if k in row)
        for m in measures:
            if m in row:
                s = row[m]
                writer.writerow([row["group"], row["source"], key_text, m, s.n, _num(s.mean), _num(s.low), _num(s.high)])
    return buffer.getvalue()


# --------------------------------------------------------------------------- plots


# Past this many groups the legend moves outside the axes and the confidence bands fade, so the
# lines stay readable.
CROWDED = 5


def _figure(title: str, groups: int = 1, integer_x: bool = True):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10.5 if groups > CROWDED else 7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and chain lengths are whole numbers
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _legend(ax, groups: int) -> None:  # noqa: ANN001 - a matplotlib Axes
    if groups > CROWDED:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    else:
        ax.legend(fontsize=8, loc="best")


def _styles(n: int) -> list[tuple[Any, str]]:
    """(colour, line style) per group: tab10 up to 10 groups, tab20 beyond, then dashed repeats."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    size = 10 if n <= 10 else 20
    return [(cmap(i % size), ("-", "--", ":")[(i // size) % 3]) for i in range(n)]


def _colors(n: int) -> list:
    return [color for color, _ in _styles(n)]


def plot_accuracy_vs_step(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Mean held-out pass@1 per step, one line per group, a shaded 95% band where there is one."""
    fig, ax = _figure(f"held-out pass@1 vs training step (mean, {CONFIDENCE:.0%} CI over seeds)", len(groups))
    band_alpha = 0.2 if len(groups) <= CROWDED else 0.06
    for group, (color, style) in zip(groups, _styles(len(groups))):
        steps = sorted(group.curve)
        means = [group.curve[s].mean for s in steps]
        ax.plot(steps, means, marker="o", markersize=3, color=color, linestyle=style,
                label=f"{group.label} (n={len(group.runs)})")
        lows, highs = [group.curve[s].low for s in steps], [group.curve[s].high for s in steps]
        if not any(math.isnan(x) for x in lows):
            ax.fill_between(steps, lows, highs, color=color, alpha=band_alpha, linewidth=0)
    ax.set_xlabel("training step (one batch of rollouts and its policy updates)")
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(-0.02, 1.02)
    _legend(ax, len(groups))
    return _save(fig, path)


def plot_final_accuracy(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Final held-out pass@1 per group, best first, with its 95% interval over seeds; a dashed line
    marks GRPO's mean when a plain ``grpo`` group is there, the baseline everything is read against."""
    fig, ax = _figure(f"final held-out pass@1 (mean, {CONFIDENCE:.0%} CI over seeds)", integer_x=False)
    fig.set_size_inches(7.5, 1.2 + 0.32 * max(1, len(groups)))
    ordered = sorted(groups, key=lambda g: g.pass1.mean)
    colors = dict(zip([g.label for g in groups], _colors(len(groups))))
    for y, group in enumerate(ordered):
        stat = group.pass1
        if math.isnan(stat.low):
            ax.plot([stat.mean], [y], "o", color=colors[group.label])
        else:
            ax.errorbar([stat.mean], [y], xerr=[[stat.mean - stat.low], [stat.high - stat.mean]], fmt="o",
                        capsize=3, color=colors[group.label])
    baseline = next((g for g in groups if g.label == "grpo"), None)
    if baseline is not None:
        ax.axvline(baseline.pass1.mean, color="grey", linestyle="--", linewidth=1, label="grpo mean")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(ordered)), [f"{g.label} (n={len(g.runs)})" for g in ordered], fontsize=8)
    ax.set_xlabel("held-out pass@1 after training")
    return _save(fig, path)


def plot_accuracy_by_length(groups: Sequence[GroupSummary], path: str | Path) -> Path:
    """Final held-out accuracy per chain length, one line per group with 95% error bars."""
    fig, ax = _figure(f"final held-out accuracy by chain length (mean, {CONFIDENCE:.0%} CI over seeds)", len(groups))
    if not any(g.by_length for g in groups):
        ax.text(0.5, 0.5, "no chain lengths in the eval rows", ha="center", va="center", transform=ax.transAxes)
    width = 0.25 / max(1, len(groups))
    for i, (group, (color, style)) in enumerate(zip(groups, _styles(len(groups)))):
        if not group.by_length:
            continue
        lengths = sorted(group.by_length)
        xs = [n + (i - (len(groups) - 1) / 2) * width for n in lengths]  # side by side, not on top
        means = [group.by_length[n].mean for n in lengths]
        errors = [[0.0 if math.isnan(group.by_length[n].low) else group.by_length[n].mean - group.by_length[n].low
                   for n in lengths],
                  [0.0 if math.isnan(group.by_length[n].high) else group.by_length[n].high - group.by_length[n].mean
                   for n in lengths]]
        ax.errorbar(xs, means, yerr=errors, marker="o", markersize=4, capsize=3, color=color, linestyle=style,
                    label=f"{group.label} (n={len(group.runs)})")
    ax.set_xlabel("chain length (computed steps)")
    ax.set_ylabel("held-out accuracy (fraction of samples correct)")
    ax.set_ylim(-0.02, 1.02)
    if any(g.by_length for g in groups):
        _legend(ax, len(groups))
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:  # noqa: ANN001 - a matplotlib Figure
    path = Path(path)
    with run_files.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path


# --------------------------------------------------------------------------- writing


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Write every file of the report into ``out_dir`` (each atomically); returns their paths."""
    out_dir = Path(out_dir)
    written = [
        run_files.atomic_write_text(out_dir / "report.md", render_markdown(report)),
        run_files.atomic_write_text(out_dir / "report.csv", render_csv(report)),
        plot_final_accuracy(report.groups, out_dir / "final_accuracy.png"),
        plot_accuracy_vs_step(report.groups, out_dir / "accuracy_vs_step.png"),
        plot_accuracy_by_length(report.groups, out_dir / "accuracy_by_length.png"),
    ]
    quality_csv = out_dir / "credit_quality.csv"
    if report.credit_quality:
        written.append(run_files.atomic_write_text(quality_csv, render_credit_quality_csv(report)))
    elif quality_csv.exists():  # left by an earlier report over other runs
        quality_csv.unlink()
    return written
