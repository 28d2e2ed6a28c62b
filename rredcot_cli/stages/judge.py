"""`rredcot judge`: how good each credit method's credit is, on the run's saved traces.

On the saved samples and segments: Monte Carlo reference values V(S_0..S_K) with
``judge.reference_k`` continuations per segment boundary, computed once; then every method of
``judge.methods`` runs ``judge.reruns`` times with different seeds, and one row per method
(per batch, with ``judge.batches``: the traces cut into independent batches of whole prompt
groups, so every column gets a 95% interval over batches) records its agreement with the reference (Spearman/Pearson of values and credits), first-error
localisation on step-checked benchmarks (with chance level), the spread of its token advantages
over the reruns, and its cost relative to the sample stage. Writes
``judge/credit_quality.parquet`` (``rredcot report`` shows it) and prints the table.

The reference is kept in ``<run.dir>/mc-reference/<key>.parquet`` (the key covers the seed,
model, sampling settings, ``judge.reference_k`` and the traces), so judging more methods on the
same traces later (another ``run.tag``, another batch split) reads it instead of sampling it
again; the manifest's ``reference.reused`` says which happened.

Seeds: the reference samples with ``derive_seed(seed, "judge", "reference")``; rerun r of every
method runs after ``seed_everything(derive_seed(seed, "judge", "rerun", r))`` with every method
parameter named ``seed`` or ``*_seed`` set to that seed too. Same seed, same table (but seconds).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.table import Table

from rredcot_cli.rng import derive_seed, seed_everything
from rredcot_cli.store import artifacts, runs
from rredcot_cli.store.hashing import config_hash
from rredcot_cli.config.ranges import check_method_params
from rredcot_cli.config.search import config_file
from rredcot_cli.errors import ArtifactError, ConfigError, one_line
from rredcot_cli.console import console, print_table, progress_bar
from rredcot_cli.stages.common import (
    make_benchmark,
    make_collaborators,
    make_policy,
    read_segmented_samples,
    warn_if_untrained_critic,
)
from rredcot_cli.methods import get_method, method_names
from rredcot_cli.train.distributed import split_evenly
from rredcot_cli.report.judge import (CONTROLS, advantage_spread, agreement, checks_steps,
                                      constant_within_completions, control_values, first_error_segments,
                                      localisation, problem_of)
from rredcot_cli.methods.mc import mc_reference_values
from rredcot_cli.pipeline import (attribute, completion_entropies, credit_batch, segment_mean_advantages,
                                  selected_credit)
from rredcot_cli.metrics import mean_ci

CONFIG_KEYS = ["seed", "model", "backend", "benchmark", "sampling", "judge"]


def judged_methods(requested: list[str] | None) -> list[str]:
    """The methods to judge, in the given order (null: every registered one, sorted); unknown
    names raise ``ConfigError`` listing the valid ones."""
    valid = method_names()
    if requested is None:
        return valid
    unknown = [name for name in requested if name not in valid]
    if unknown:
        raise ConfigError(f"unknown method(s) in judge.methods: {', '.join(unknown)}; valid: {', '.join(valid)}")
    if not requested:
        raise ConfigError(f"judge.methods is empty; name some of: {', '.join(valid)} (or null for all)")
    if len(set(requested)) != len(requested):
        raise ConfigError(f"judge.methods names a method twice: {', '.join(requested)}")
    return list(requested)


def method_params(name: str, changes: dict[str, Any] | None, model: DictConfig | None = None) -> dict[str, Any]:
    """Parameters of method ``name``: its dataclass defaults, then its ``method/<name>.yaml``
    (the first on the config search path: the user's config folders, then the packaged ones;
    none for a plugin method without one), then ``changes`` (``judge.params.<name>``). A key the
    method does not declare, or a value of the wrong type, raises ``ConfigError`` naming
    ``judge.params.<name>.<key>``."""
    spec = get_method(name)
    params = OmegaConf.structured(spec.plain_params())  # its choices: check_method_params
    OmegaConf.set_struct(params, True)
    yaml_file = config_file("method", name)
    defaults = method_yaml(yaml_file, model) if yaml_file is not None else {}
    defaults.pop("name", None)
    for prefix, layer in [(f"{yaml_file}: ", defaults), (f"judge.params.{name}.", dict(changes or {}))]:
        for key, value in layer.items():
            if key not in spec.param_names():
                raise ConfigError(f"unknown key '{prefix}{key}' for method '{name}'; valid keys: "
                                  f"{', '.join(spec.param_names()) or '(none)'}")
            try:
                OmegaConf.update(params, key, value, merge=True)
            except OmegaConfBaseException as e:
                raise ConfigError(f"{prefix}{key}={value}: {one_line(str(e).splitlines()[0])}") from e
    values = OmegaConf.to_container(params, resolve=True, enum_to_str=True)
    check_method_params(name, values, f"judge.params.{name}.")
    return values


def method_yaml(yaml_file, model: DictConfig | None) -> dict[str, Any]:
    """A method's config file with its ``${model.*}`` interpolations (e.g. rredcot's value estimator,
    the model preset's choice) resolved against ``model``, as a composed config would have them."""
    scope = OmegaConf.create({"model": OmegaConf.to_container(model, resolve=True) if model is not None else {},
                              "method": OmegaConf.load(yaml_file)})
    try:
        return OmegaConf.to_container(scope.method, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{yaml_file}: {one_line(str(e).splitlines()[0])}") from e


def seeded(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """``params`` with every parameter named ``seed`` or ``*_seed`` set to ``seed``."""
    return {k: (seed if k == "seed" or k.endswith("_seed") else v) for k, v in params.items()}


def _check_options(cfg: DictConfig, overrides: list[str], names: list[str]) -> None:
    for text in overrides:
        key = text.lstrip("+").split("=", 1)[0]
        if key == "method" or key.startswith("method."):
            raise ConfigError(f"'{text}': rredcot judge does not use method=; choose methods with "
                              f"judge.methods=[a,b] and set their options with +judge.params.NAME.KEY=VALUE")
    stray = [name for name in cfg.judge.params if name not in names]
    if stray:
        raise ConfigError(f"judge.params names method(s) not being judged: {', '.join(stray)} "
                          f"(judge.methods: {', '.join(names)})")
    if cfg.judge.reference_k < 1:
        raise ConfigError(f"judge.reference_k={cfg.judge.reference_k}: need at least 1 continuation per boundary")
    if cfg.judge.reruns < 1:
        raise ConfigError(f"judge.reruns={cfg.judge.reruns}: need at least 1 run per method")
    if cfg.judge.batches < 1:
        raise ConfigError(f"judge.batches={cfg.judge.batches}: need at least 1 batch")


def split_batches(samples: list[dict], segments: list[dict], batches: int) -> list[tuple[list[dict], list[dict]]]:
    """``(samples, segments)`` of ``batches`` contiguous runs of whole prompt groups, as even as
    possible; ``ConfigError`` when there are fewer prompts than batches."""
    prompts = list(dict.fromkeys(s["prompt_id"] for s in samples))
    if len(prompts) < batches:
        raise ConfigError(f"judge.batches={batches}: the saved samples hold {len(prompts)} prompts; sample at least "
                          f"{batches} (sample.num_prompts) or ask for fewer batches")
    out = []
    for part in split_evenly(prompts, batches):
        mine = set(part)
        out.append(([s for s in samples if s["prompt_id"] in mine], [g for g in segments if g["prompt_id"] in mine]))
    return out


def _sample_stage(samples_path: Path) -> dict[str, Any]:
    """``extra`` of the finished sample stage that wrote ``samples_path`` ({} if there is none)."""
    manifest_path = samples_path.parent / runs.MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict) or manifest.get("status") != "complete":
        return {}
    return dict(manifest.get("extra") or {})


def run(cfg: DictConfig, overrides: list[str]) -> None:
    names = judged_methods(None if cfg.judge.methods is None else list(cfg.judge.methods))
    _check_options(cfg, overrides, names)
    changes = OmegaConf.to_container(cfg.judge.params, resolve=True)
    all_params = {name: method_params(name, changes.get(name), cfg.model) for name in names}
    inputs = {"samples": runs.find_input(cfg, "samples"), "segments": runs.find_input(cfg, "segments")}

    # The critic group configures ppo's critic; it names the judgement only when ppo is judged.
    keys = CONFIG_KEYS + (["critic"] if any("critic" in get_method(n).needs for n in names) else [])
    out = runs.begin_stage(cfg, "judge", overrides, inputs=inputs, keys=keys)
    if out is None:
        return
    samples, segments = read_segmented_samples(inputs)
    batches = split_batches(samples, segments, cfg.judge.batches)
    sample_stage = _sample_stage(inputs["samples"])
    sample_seconds = sample_stage.get("seconds")

    seed_everything(cfg.seed)
    benchmark = make_benchmark(cfg)
    policy = make_policy(cfg)
    answer_probe = getattr(benchmark, "ANSWER_PROBE", None)
    # The sample stage's time, shared out over the batches by completions (for "x sample").
    batch_sample_seconds = [sample_seconds * len(b) / len(samples) if sample_seconds else None for b, _ in batches]

    reference_path = reference_cache_path(cfg, inputs)
    cached = read_reference(reference_path)
    reference = (cached["stats"] if cached else
                 {"k": cfg.judge.reference_k, "seed": derive_seed(cfg.seed, "judge", "reference"), "seconds": 0.0})
    reference.update(path=str(reference_path), reused=cached is not None)
    computed: dict[tuple[str, int], list[float]] = {}
    rows = []
    known_first_errors = 0
    started = time.perf_counter()
    with progress_bar("judge", total=len(batches) * (1 + len(names))) as advance:
        for index, (batch_samples, batch_segments) in enumerate(batches):
            where = f"batch {index + 1}/{len(batches)}: " if len(batches) > 1 else ""
            batch = credit_batch(batch_samples, batch_segments, answer_probe=answer_probe, benchmark=benchmark)
            targets = None
            if checks_steps(benchmark):
                targets = first_error_segments(batch_samples, batch.segment_ids, benchmark,
                                               [problem_of(s) for s in batch_samples], policy.tokenizer)
                known_first_errors += sum(t is not None for t in targets)
            if cached:
                ref_values = reference_rows(cached["values"], batch_samples, batch.num_segments, reference_path)
            else:
                advance(0, info=f"{where}mc reference, K={cfg.judge.reference_k}")
                ref_stats: dict[str, int] = {}
                ref_started = time.perf_counter()
                # Continuations depend on (seed, prefix) only, so one seed serves every batch.
                ref_values = mc_reference_values(batch, policy, k=cfg.judge.reference_k,
                                                 max_new_tokens=cfg.sampling.max_new_tokens,
                                                 temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                                 seed=reference["seed"], stats=ref_stats)
                reference["seconds"] += time.perf_counter() - ref_started
                for key, value in ref_stats.items():
                    reference[key] = reference.get(key, 0) + value
                for sample, values, count in zip(batch_samples, ref_values, batch.num_segments.tolist()):
                    computed[(sample["prompt_id"], int(sample["sample_idx"]))] = values[: count + 1].tolist()
            advance(1)
            entropies = None  # of this batch's completions, once, for methods that select tokens in the loss
            for name in names:
                advance(0, info=f"{where}{name}")
                spec = get_method(name)
                collaborators = make_collaborators(cfg, spec, policy) if spec.needs else {}
                warn_if_untrained_critic(cfg, spec)
                if entropies is None and spec.token_selection(all_params[name]) is not None:
                    entropies = batch_entropies(policy, batch_samples, batch.segment_ids.shape[1])
                row = judge_method(name, all_params[name], batch_samples, batch_segments, answer_probe, collaborators,
                                   ref_values, targets, reruns=cfg.judge.reruns, seed=cfg.seed,
                                   sample_seconds=batch_sample_seconds[index], benchmark=benchmark,
                                   entropies=entropies)
                rows.append({**row, "batch": index})
                advance(1)
            rows += [{**judge_control(kind, batch, ref_values), "batch": index} for kind in CONTROLS]
    seconds = time.perf_counter() - started
    if not cached:
        write_reference(reference_path, computed, reference)

    path = artifacts.write_artifact("credit_quality", rows, out.dir / "credit_quality.parquet")
    out.finish({"credit_quality": path}, extra={
        "seconds": seconds, "reference": reference, "methods": all_params, "reruns": cfg.judge.reruns,
        "rerun_seeds": [derive_seed(cfg.seed, "judge", "rerun", r) for r in range(cfg.judge.reruns)],
        "completions": len(samples), "segments": len(segments), "batches": len(batches),
        "batch_completions": [len(b) for b, _ in batches],
        "incorrect_with_known_first_error": known_first_errors if checks_steps(benchmark) else None,
        "sample_seconds": sample_seconds, "sample_generated_tokens": sample_stage.get("generated_tokens"),
    })
    if len(batches) > 1:
        print_batch_table(rows, len(batches), len(samples), cfg.judge.reruns)
    else:
        print_method_table(rows, reference, sample_stage, len(samples), len(segments), cfg.judge.reruns)
    console.print(f"judged {len(names)} methods x {cfg.judge.reruns} reruns in {seconds:.1f}s -> [bold]{path}[/bold]")


def reference_cache_path(cfg: DictConfig, inputs: dict[str, Path]) -> Path:
    """Where the MC reference of these traces is kept: ``<run.dir>/mc-reference/<key>.parquet``,
    the key covering what the continuations depend on (seed, model, sampling settings,
    ``judge.reference_k``, and the samples and segments files). Any judge run on the same traces
    (other methods, tags, batch splits) then reuses it instead of sampling it again."""
    digest = hashlib.sha256(config_hash(cfg, ["seed", "model", "sampling"]).encode())
    # The definition's version: a reference kept before a change of what it estimates is not reused
    # (2: continuations get the completion budget left after their prefix, values/mc.py mc_rewards).
    digest.update(f"\0v2\0k={cfg.judge.reference_k}".encode())
    for name in sorted(inputs):
        digest.update(f"\0{name}\0{runs.sha256_file(inputs[name])}".encode())
    return Path(cfg.run.dir) / "mc-reference" / f"{digest.hexdigest()[:12]}.parquet"


def read_reference(path: Path) -> dict[str, Any] | None:
    """The kept reference at ``path`` ({"values": {(prompt_id, sample_idx): [V(S_0..S_K)]}, "stats":
    what computing it cost}), or None when there is none (or only half of one)."""
    stats_path = path.with_suffix(".json")
    if not (path.is_file() and stats_path.is_file()):
        return None
    table = artifacts.read_artifact("reference_values", path).to_pydict()
    values = {(p, i): v for p, i, v in zip(table["prompt_id"], table["sample_idx"], table["values"])}
    return {"values": values, "stats": json.loads(stats_path.read_text())}


def write_reference(path: Path, values: dict[tuple[str, int], list[float]], stats: dict[str, Any]) -> None:
    """Keep a computed reference: the values, then the cost record (whose presence marks it whole)."""
    rows = [{"prompt_id": p, "sample_idx": i, "values": v} for (p, i), v in values.items()]
    artifacts.write_artifact("reference_values", rows, path)
    kept = {k: v for k, v in stats.items() if k not in ("path", "reused")}
    with runs.atomic_path(path.with_suffix(".json")) as tmp:
        Path(tmp).write_text(json.dumps(kept, indent=2) + "\n")


def reference_rows(values: dict[tuple[str, int], list[float]], samples: list[dict], num_segments, path: Path):
    """(B, S+1) reference of one batch from a kept reference, NaN past each K_i (as
    ``mc_reference_values`` returns it)."""
    counts = num_segments.tolist()
    out = torch.full((len(samples), max(counts, default=0) + 1), float("nan"))
    for row, (sample, count) in enumerate(zip(samples, counts)):
        kept = values.get((sample["prompt_id"], int(sample["sample_idx"])))
        if kept is None or len(kept) != count + 1:
            raise ArtifactError(f"{path} does not match the saved segments of {sample['prompt_id']} "
                                          f"#{sample['sample_idx']}; delete it to sample the reference again")
        out[row, : count + 1] = torch.tensor(kept)
    return out


def batch_entropies(policy, samples: list[dict], width: int) -> torch.Tensor:
    """(B, width) next-token entropy at every completion token of ``samples`` (0 on padding)."""
    out = torch.zeros(len(samples), width)
    for i, row in enumerate(completion_entropies(policy, samples)):
        out[i, : len(row)] = torch.tensor(row[:width])
    return out


def judge_method(name: str, params: dict[str, Any], samples: list[dict], segments: list[dict],
                 answer_probe: str | None, collaborators: dict[str, Any], ref_values, targets: list | None, *, reruns: int, seed: int,
                 sample_seconds: float | None, benchmark: Any = None,
                 entropies: torch.Tensor | None = None) -> dict[str, Any]:
    """One credit-quality row: the method run ``reruns`` times on a fresh batch of the traces
    (``benchmark``: the configured one, for methods that verify new text). A method that also
    selects the tokens of the policy gradient (``MethodSpec.token_selection``) is judged on the
    credit the update would train on (``pipeline.selected_credit``, with ``entropies`` (B, T) of
    the traces under the judged policy)."""
    spec = get_method(name)
    selection = spec.token_selection(params)
    measures: list[dict[str, Any]] = []
    advantages = []
    constant = True
    hits = 0
    chance = 0.0
    known = 0 if targets is None else sum(t is not None for t in targets)
    for r in range(reruns):
        rerun_seed = derive_seed(seed, "judge", "rerun", r)
        seed_everything(rerun_seed)
        batch = credit_batch(samples, segments, answer_probe=answer_probe, benchmark=benchmark)
        started = time.perf_counter()
        credit = attribute(spec, batch, seeded(params, rerun_seed), collaborators)
        if selection is not None:
            credit = selected_credit(credit, batch, selection, entropies)
        seconds = time.perf_counter() - started
        stats = batch.extras.get("value_stats") or {}
        boundaries = stats.get("value_boundaries")
        measures.append({
            **agreement(credit.segment_values, credit.segment_credits, ref_values, batch.num_segments, batch.rewards,
                        segment_mean_advantages(credit.token_advantages, batch)),
            "value_coverage": stats["value_covered"] / boundaries if boundaries else None,
            "seconds": seconds,
            "forward_tokens": stats.get("forward_tokens", 0) + stats.get("prefill_tokens", 0),
            "generated_tokens": stats.get("generated_tokens", 0),
            "backward_tokens": stats.get("backward_tokens", 0),
        })
        advantages.append(credit.token_advantages)
        constant &= constant_within_completions(credit.segment_credits, batch.num_segments)
        if targets is not None:
            h, _, c = localisation(credit.segment_credits, batch.num_segments, targets)
            hits, chance = hits + h, chance + c

    def mean(key: str) -> float | None:
        values = [m[key] for m in measures if m[key] is not None]
        return sum(values) / len(values) if values else None

    row = {key: mean(key) for key in measures[0]}
    for key in ("forward_tokens", "generated_tokens", "backward_tokens"):
        row[key] = round(row[key])
    row.update(
        method=name,
        credit_constant=constant,
        # Over every rerun: hits / (reruns x completions with a known first wrong step).
        first_error_rate=hits / (reruns * known) if known else None,
        first_error_chance=chance / (reruns * known) if known else None,
        first_error_completions=known,
        advantage_std=advantage_spread(advantages, batch.token_mask),
        seconds_vs_sample=row["seconds"] / sample_seconds if sample_seconds else None,
    )
    return row


def judge_control(kind: str, batch, ref_values) -> dict[str, Any]:
    """The credit-quality row of control ``kind`` (``report.judge.CONTROLS``) on one batch: its
    agreement with the reference; no cost, no reruns, no localisation (its credits tie)."""
    values, credits = control_values(kind, batch.rewards, batch.group_ids, batch.num_segments)
    return {
        **agreement(values, credits, ref_values, batch.num_segments, batch.rewards),
        "advantage_spearman": None, "advantage_spearman_within": None,
        "method": f"control:{kind}", "credit_constant": False, "first_error_rate": None,
        "first_error_chance": None, "first_error_completions": 0, "advantage_std": None, "seconds": 0.0,
        "seconds_vs_sample": None, "forward_tokens": 0, "generated_tokens": 0, "backward_tokens": 0,
        "value_coverage": None,
    }


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_method_table(rows: list[dict], reference: dict, sample_stage: dict, completions: int, segments: int,
                       reruns: int) -> None:
    table = Table(title=f"rredcot judge · {completions} completions, {segments} segments, {reruns} reruns",
                  show_header=True, header_style="bold")
    for column in ["method", "value ρ / r", "value ρ inner", "value MSE inner", "value ρ | R", "credit ρ / r", "credit ρ | R",
                   "adv ρ | R", "coverage", "first error (chance)", "adv std", "seconds", "× sample", "fwd tokens",
                   "gen tokens"]:
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        first = "—" if row["first_error_rate"] is None else \
            f"{row['first_error_rate']:.2f} ({row['first_error_chance']:.2f})"
        if row["credit_constant"] and row["first_error_rate"] is not None:
            first += " const"
        table.add_row(
            row["method"],
            "—" if row["value_spearman"] is None else f"{row['value_spearman']:.3f} / {_num(row['value_pearson'])}",
            _num(row["value_spearman_inner"]), _num(row["value_mse_inner"], 4), _num(row["value_spearman_within"]),
            f"{_num(row['credit_spearman'])} / {_num(row['credit_pearson'])}", _num(row["credit_spearman_within"]),
            _num(row["advantage_spearman_within"]), _num(row["value_coverage"], 2), first, _num(row["advantage_std"]),
            f"{row['seconds']:.2f}", _num(row["seconds_vs_sample"], 2),
            f"{row['forward_tokens']:,}", f"{row['generated_tokens']:,}",
        )
    print_table(table)
    sample = f"; sample stage {sample_stage['seconds']:.1f}s, {sample_stage.get('generated_tokens', 0):,} generated " \
             f"tokens" if sample_stage.get("seconds") else "; no sample-stage manifest"
    console.print(f"reference: MC, K={reference['k']} per boundary, {reference['seconds']:.1f}s, "
                  f"{reference.get('generated_tokens', 0):,} generated tokens{sample}. ρ Spearman, r Pearson; "
                  "'inner' leaves out each completion's last segment (its value is the reward); MSE: mean "
                  "squared difference from the reference there (lower is better); '| R' ranks within completions of one reward (inner values), where control:outcome "
                  "(V = own reward) carries nothing; control:baseline keeps V(S_0); "
                  "'const': credit constant within a completion, so it cannot localise (a tie is no hit).")


# Columns of the batch table: (header, column, digits).
BATCH_COLUMNS = [("value ρ", "value_spearman", 3), ("value ρ inner", "value_spearman_inner", 3),
                 ("value MSE inner", "value_mse_inner", 4),
                 ("value ρ | R", "value_spearman_within", 3), ("credit ρ", "credit_spearman", 3),
                 ("credit ρ | R", "credit_spearman_within", 3), ("adv ρ | R", "advantage_spearman_within", 3),
                 ("coverage", "value_coverage", 2),
                 ("first error", "first_error_rate", 2),
                 ("chance", "first_error_chance", 2), ("adv std", "advantage_std", 3), ("seconds", "seconds", 2),
                 ("× sample", "seconds_vs_sample", 2)]


def batch_summary(rows: list[dict]) -> dict[str, dict[str, tuple[float, float, float, int] | None]]:
    """Per method and column of ``BATCH_COLUMNS``: (mean, low, high, batches) over the batches
    where the column has a value, with the 95% Student-t interval; None where it never has."""
    out: dict[str, dict] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        out[method] = {}
        for _, column, _ in BATCH_COLUMNS:
            values = [float(r[column]) for r in mine if r[column] is not None]
            out[method][column] = (*mean_ci(values), len(values)) if values else None
    return out


def print_batch_table(rows: list[dict], batches: int, completions: int, reruns: int) -> None:
    table = Table(title=f"rredcot judge · {completions} completions in {batches} batches, {reruns} reruns; "
                        "mean ± 95% interval over batches", show_header=True, header_style="bold")
    table.add_column("method")
    for header, _, _ in BATCH_COLUMNS:
        table.add_column(header, justify="right")
    for method, stats in batch_summary(rows).items():
        cells = []
        for _, column, digits in BATCH_COLUMNS:
            stat = stats[column]
            if stat is None:
                cells.append("—")
            elif stat[1] != stat[1]:  # NaN: a single batch has a value
                cells.append(f"{stat[0]:.{digits}f}")
            else:
                cells.append(f"{stat[0]:.{digits}f} ± {(stat[2] - stat[1]) / 2:.{digits}f}")
        table.add_row(method, *cells)
    print_table(table)
    console.print("'inner': without each completion's last segment (its value is the reward); MSE: mean squared "
                  "difference from the reference there (lower is better); '| R': ranked within "
                  "completions of one reward, where control:outcome (V = own reward) carries nothing; "
                  "control:baseline keeps V(S_0) until the reward; adv: each segment's mean token advantage (after "
                  "the advantage rule) against the reference credit; coverage: inner boundaries with evidence.")
