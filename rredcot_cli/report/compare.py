"""Grouping and statistics of finished training runs (``rredcot report``).

Runs loaded by ``rredcot_cli.report.load`` are grouped by method and by every other option that
differs between them (seeds are what varies inside a group), and aggregated over seeds with 95%
Student-t intervals (``rredcot_cli.metrics.mean_ci``):

- held-out pass@1 against the training step (step 0 is the eval before training);
- final held-out accuracy by chain length (``steps`` of synthetic problems);
- final pass@1, pass@k, maj@k, the change in pass@1 from before training, wall time and
  generated tokens;
- credit quality, from ``credit_quality.parquet`` / ``judge/**/*.parquet`` in a run dir when
  there are any (read generically: every numeric column averaged per run, then over runs), and
  the cost of ``rredcot attribute`` on saved traces when its manifests are there;
- paired against a baseline group: per-seed differences in final pass@1 and the updates and
  tokens a run needed to reach the baseline's final pass@1. A pair is a common-random-number pair
  only when both arms ran the same code: a group whose pairs cross commits (the manifests' git
  sha differs, or one is not recorded) is left out of the paired section, named in
  ``Report.refused``, unless ``allow_mixed_commits`` keeps it, flagged (``PairedRow.cross_commit``).
  Pairs whose arms ran on different CPUs are kept and named (``PairedRow.cross_machine``): runs are
  bit-identical only on one kind of CPU, so such a pair shares the design, not the numbers.

``build_report(paths)`` loads, labels (``assign_labels``), groups (``summarize_group``) and
aggregates into a ``Report`` (``Stat``, ``GroupSummary``, ``PairedRow``). The files are written by
``rredcot_cli.report.write`` (tables: ``rredcot_cli.report.markdown``; figures:
``rredcot_cli.report.plots``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf
import pyarrow as pa

from rredcot_cli.errors import RunError
from rredcot_cli.metrics import mean_ci
from rredcot_cli.report.load import RunResult, config_leaves, load_runs, on_different_cpus, same_value
from rredcot_cli.config.schema import Config

CONFIDENCE = 0.95
# Config groups that decide what a training run computes (train's config keys, without seed).
GROUPING_KEYS = ("model", "backend", "benchmark", "segment", "method", "sampling", "train", "critic")
# Credit-quality files: columns that identify rows rather than measure anything.
ID_COLUMNS = {"prompt_id", "sample_idx", "segment_idx", "step", "seed", "batch"}
MAX_KEY_VALUES = 20  # a string column with more distinct values is an id, not a key


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
    refused: list["PairedRow"] = field(default_factory=list)  # pairs across commits, left out of ``paired``
    allow_mixed_commits: bool = False  # such pairs are kept in ``paired`` (flagged) instead


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
    # (seed, this group's commit, the baseline's) of every pair not on one known commit
    cross_commit: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    # (seed, this group's CPUs, the baseline's) of every pair whose recorded CPUs differ
    cross_machine: list[tuple[int, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)



# --------------------------------------------------------------------------- grouping



def _varying(results: Sequence[RunResult], keys_of) -> set[str]:  # noqa: ANN001 - a function
    """Leaves whose value is not the same in every run that has them."""
    values: dict[str, list[Any]] = {}
    for r in results:
        for key, value in keys_of(r).items():
            values.setdefault(key, []).append(value)
    return {k for k, vs in values.items() if any(not same_value(vs[0], v) for v in vs[1:])}


def _schema_defaults(groups: Sequence[str]) -> dict[str, Any]:
    """Leaves of the schema's defaults under ``groups``: the value an option had in runs made
    before it existed (their config.yaml lacks it)."""
    return config_leaves(OmegaConf.to_container(OmegaConf.structured(Config), resolve=False), groups)


# Method options added after runs were made without them, with the value those runs ran with
# (not today's default where the default changed with the option): rredcot's window was counted in
# tokens until is_window_unit arrived; segments became the default later.
METHOD_OPTIONS_ADDED_LATER = {"rredcot": {"method.is_window_unit": "tokens"}}


# Options that are part of a run's seed, not of its arm: issue 39's runs set train.data_order_seed to
# the seed, so its value differs between every two seeds of one arm. For grouping only whether it is
# set counts (the prompt stream shuffled per seed, or the split's own order); runs pair by ``seed``.
SEED_OPTIONS = {"train.data_order_seed": "per seed"}


def _seed_options_as_set(leaves: dict[str, Any]) -> dict[str, Any]:
    return {k: (SEED_OPTIONS[k] if k in SEED_OPTIONS and v is not None else v) for k, v in leaves.items()}


def _method_leaves(r: RunResult) -> dict[str, Any]:
    return {**METHOD_OPTIONS_ADDED_LATER.get(r.method, {}), **config_leaves(r.config, ["method"])}


def assign_labels(results: Sequence[RunResult]) -> None:
    """Label each run ``method`` plus the options that set it apart (``rredcot · segment.name=fixed``).

    Non-method options count when they differ anywhere in the set (an option missing from an older
    run's config has its default); a run's label shows those where it is not at the default, or
    where no run is; a seed option (``SEED_OPTIONS``) counts only as set or not. ``method.*`` parameters count when they differ between runs of the same
    method (methods have different parameters anyway) and are always shown; a method option an
    older run lacks has the value it ran with (``METHOD_OPTIONS_ADDED_LATER``).
    """
    others = [g for g in GROUPING_KEYS if g != "method"]
    defaults = _schema_defaults(others)

    def shared_leaves(r: RunResult) -> dict[str, Any]:
        return _seed_options_as_set({**defaults, **config_leaves(r.config, others)})

    shared = _varying(results, shared_leaves)
    nobody_default = {k for k in shared if k not in defaults
                      or not any(same_value(shared_leaves(r)[k], defaults[k]) for r in results)}
    by_method: dict[str, set[str]] = {}
    for method in {r.method for r in results}:
        same_method = [r for r in results if r.method == method]
        by_method[method] = _varying(same_method, _method_leaves) - {"method.name"}
    for r in results:
        method_leaves = _method_leaves(r)
        leaves = shared_leaves(r)
        shown = [(k, method_leaves[k]) for k in sorted(by_method[r.method] & set(method_leaves))]
        shown += [(k, leaves[k]) for k in sorted(shared & set(leaves))
                  if k in nobody_default or not same_value(leaves[k], defaults[k])]
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

    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)


def _is_text(type_) -> bool:  # noqa: ANN001 - a pyarrow type

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
            tokens_to_target=Stat.of(tokens) if len(tokens) == len(steps) and tokens else None,
            cross_commit=[] if g is base else [(s, mine[s].commit, by_seed[s].commit) for s in seeds
                                               if mine[s].commit is None or mine[s].commit != by_seed[s].commit],
            cross_machine=[] if g is base else [(s, mine[s].machines, by_seed[s].machines) for s in seeds
                                                if on_different_cpus(mine[s].machines, by_seed[s].machines)]))
    return out


def short_commit(sha: str | None) -> str:
    """A manifest's git sha as people write it (7 hex digits), or ``unknown``."""
    return sha[:7] if sha else "unknown"


def cross_commit_text(row: PairedRow) -> str:
    """``seed 0: b0dd4db vs 5be240e, seed 1: ...``: the pairs of ``row`` not on one known commit."""
    return ", ".join(f"seed {seed}: {short_commit(mine)} vs {short_commit(base)}" for seed, mine, base in row.cross_commit)


def default_baseline(groups: Sequence[GroupSummary]) -> str | None:
    """``grpo`` when a group has that label (GRPO with nothing changed), else none."""
    return "grpo" if any(g.label == "grpo" for g in groups) else None


def build_report(paths: Sequence[str | Path], skip_unfinished: bool = False, baseline: str | None = None,
                 allow_mixed_commits: bool = False) -> Report:
    """Load, group and aggregate the runs at ``paths`` (``skip_unfinished``: leave out run dirs
    whose train stage did not finish, listed in ``Report.skipped``). ``baseline``: the group label
    the paired section compares against (default: ``grpo`` when present). Groups whose pairs
    with the baseline ran on different or unknown commits go to ``Report.refused`` instead of
    ``Report.paired``, unless ``allow_mixed_commits``."""
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
    paired = paired_summary(groups, baseline) if baseline is not None and len(groups) > 1 else []
    refused = [] if allow_mixed_commits else [row for row in paired if row.cross_commit]
    kept = paired if allow_mixed_commits else [row for row in paired if not row.cross_commit]
    return Report(runs=results, groups=groups, benchmark=results[0].config.get("benchmark", {}),
                  credit_quality=quality, credit_quality_columns=quality_columns,
                  attribute_costs=attribute_cost_summary(groups), skipped=skipped, baseline=baseline,
                  paired=kept, refused=refused,
                  allow_mixed_commits=allow_mixed_commits)
