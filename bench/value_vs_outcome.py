"""Do RREDCoT's prefix values say anything the outcome does not? (issue 37)

    python bench/value_vs_outcome.py SAMPLES CREDITS [CREDITS ...] [--reference REF] [--batches 5] [--out values.json]

SAMPLES is a `rredcot sample` artifact (samples.parquet); each CREDITS is `NAME=PATH` to the
credits.parquet that `rredcot attribute ... method=rredcot` wrote on those samples (the segment
values V(S_1..S_K) per completion). Over the completions with two or more segments in groups whose
rewards are not all equal (the only ones where a prefix value can differ from both the outcome and
the prompt's baseline), per credits file:

- `own_reward_share`: the share whose V(S_1) lies within 0.05 of their own reward R_i (a value
  that copies the outcome scores 1; before issue 37 `suffix_is` scored 0.86 on SmolLM2);
- `off_baseline_share`: the share whose V(S_1) lies more than 0.05 from the prompt's baseline V(S_0)
  = the group's mean reward (a value that says nothing scores 0);
- `later_zero_share`: the share whose segments after the first all get exactly zero credit;
- each also per batch (contiguous runs of whole prompt groups, as `rredcot judge judge.batches=N`
  cuts them) with the mean and 95% Student-t interval over batches.

With `--reference` (the judge's kept Monte Carlo reference, `<run.dir>/mc-reference/<key>.parquet`)
it also scores each credits file, and the judge's two controls (`outcome`: V = own reward,
`baseline`: V = V(S_0)), with the judge's own `agreement()` per batch: `value_spearman_inner` and
`value_spearman_within` (inner values ranked within completions of one reward), so that credits
written by an older version of the code can be judged beside today's controls.

Reads only the artifacts; deterministic; no timing.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import torch

from rredcot_cli.metrics import mean_ci
from rredcot_cli.report.judge import CONTROLS, agreement, control_values
from rredcot_cli.train.distributed import split_evenly  # how `rredcot judge` cuts its batches

TOLERANCE = 0.05
MEASURES = ("own_reward_share", "off_baseline_share", "later_zero_share")


def completion_figures(samples: list[dict], credits: list[dict]) -> list[dict]:
    """Per multi-segment completion of a mixed group: its prompt, reward, baseline, V(S_1) and
    whether every later segment's credit is zero."""
    by_prompt: dict[str, list[float]] = collections.defaultdict(list)
    for s in samples:
        by_prompt[s["prompt_id"]].append(float(s["reward"]))
    segments: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
    for c in credits:
        segments[(c["prompt_id"], c["sample_idx"])][c["segment_idx"]] = c
    out = []
    for s in samples:
        group = by_prompt[s["prompt_id"]]
        mine = segments.get((s["prompt_id"], s["sample_idx"]), {})
        if len(set(group)) < 2 or len(mine) < 2:
            continue
        first = mine[0]["value"]
        if first is None:
            raise SystemExit(f"{s['prompt_id']} #{s['sample_idx']}: the credits hold no value for segment 0; "
                             "give the credits of a method with values (method=rredcot)")
        out.append({"prompt_id": s["prompt_id"], "reward": float(s["reward"]), "baseline": sum(group) / len(group),
                    "first_value": float(first),
                    "later_zero": all(mine[k]["credit"] == 0.0 for k in sorted(mine) if k > 0)})
    return out


def shares(figures: list[dict]) -> dict[str, float | None]:
    n = len(figures)
    if not n:
        return {name: None for name in MEASURES}
    return {
        "own_reward_share": sum(abs(f["first_value"] - f["reward"]) <= TOLERANCE for f in figures) / n,
        "off_baseline_share": sum(abs(f["first_value"] - f["baseline"]) > TOLERANCE for f in figures) / n,
        "later_zero_share": sum(f["later_zero"] for f in figures) / n,
    }


def summary(samples: list[dict], credits: list[dict], batches: int) -> dict:
    figures = completion_figures(samples, credits)
    prompts = list(dict.fromkeys(s["prompt_id"] for s in samples))
    per_batch = []
    for part in split_evenly(prompts, batches):
        mine = set(part)
        per_batch.append({"completions": sum(f["prompt_id"] in mine for f in figures),
                          **shares([f for f in figures if f["prompt_id"] in mine])})
    return {"completions": len(figures), **shares(figures), "per_batch": per_batch,
            "over_batches": over_batches(per_batch, MEASURES)}


def over_batches(per_batch: list[dict], names) -> dict:
    """Mean and 95% Student-t interval of each figure over the batches where it is defined."""
    out = {}
    for name in names:
        values = [b[name] for b in per_batch if b[name] is not None]
        mean, low, high = mean_ci(values) if values else (None, None, None)
        out[name] = {"mean": mean, "low": low, "high": high, "batches": len(values)}
    return out


def credit_tensors(samples: list[dict], credits: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(segment_values, segment_credits) (B, S) with NaN past K_i, and num_segments (B,)."""
    segments: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
    for c in credits:
        segments[(c["prompt_id"], c["sample_idx"])][c["segment_idx"]] = c
    counts = torch.tensor([len(segments[(s["prompt_id"], s["sample_idx"])]) for s in samples])
    S = int(counts.max()) if len(samples) else 0
    values = torch.full((len(samples), S), float("nan"), dtype=torch.float64)
    credit = torch.full((len(samples), S), float("nan"), dtype=torch.float64)
    for i, s in enumerate(samples):
        for k, c in segments[(s["prompt_id"], s["sample_idx"])].items():
            values[i, k] = float("nan") if c["value"] is None else c["value"]
            credit[i, k] = c["credit"]
    return values, credit, counts


def reference_tensor(samples: list[dict], path: Path, counts: torch.Tensor) -> torch.Tensor:
    kept = {(r["prompt_id"], r["sample_idx"]): r["values"] for r in pq.read_table(path).to_pylist()}
    out = torch.full((len(samples), int(counts.max()) + 1), float("nan"), dtype=torch.float64)
    for i, s in enumerate(samples):
        row = kept[(s["prompt_id"], s["sample_idx"])]
        if len(row) != int(counts[i]) + 1:
            raise SystemExit(f"{path}: {s['prompt_id']} #{s['sample_idx']} has {len(row)} reference values for "
                             f"{int(counts[i])} segments; give the reference of these samples and segments")
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out


AGREEMENT = ("value_spearman_inner", "value_spearman_within")


def judged(samples: list[dict], credits: list[dict], reference: Path, batches: int, control: str | None = None) -> dict:
    """Per batch and over batches, the judge's agreement of a credits file, or with ``control`` of that
    control on the same segments (the credits then give only the segment counts)."""
    prompts = list(dict.fromkeys(s["prompt_id"] for s in samples))
    per_batch = []
    for part in split_evenly(prompts, batches):
        mine = [s for s in samples if s["prompt_id"] in set(part)]
        groups = {pid: g for g, pid in enumerate(dict.fromkeys(s["prompt_id"] for s in mine))}
        rewards = torch.tensor([float(s["reward"]) for s in mine], dtype=torch.float64)
        values, credit, counts = credit_tensors(mine, credits)
        if control is not None:
            values, credit = control_values(control, rewards, torch.tensor([groups[s["prompt_id"]] for s in mine]),
                                            counts)
        result = agreement(values, credit, reference_tensor(mine, reference, counts), counts, rewards)
        per_batch.append({name: result[name] for name in AGREEMENT})
    return {"per_batch": per_batch, "over_batches": over_batches(per_batch, AGREEMENT)}


def _interval(stat: dict) -> str:
    if stat["mean"] is None:
        return "-"
    if stat["low"] != stat["low"]:  # NaN: one batch
        return f"{stat['mean']:.3f}"
    return f"{stat['mean']:.3f} [{stat['low']:.3f}, {stat['high']:.3f}]"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("credits", nargs="+", help="NAME=PATH of a credits.parquet")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--reference", type=Path, help="the judge's mc-reference parquet of these samples")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    samples = pq.read_table(args.samples).to_pylist()
    result = {}
    for item in args.credits:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"{item!r}: give NAME=PATH (e.g. before=runs/x/attribute/rredcot/credits.parquet)")
        credits = pq.read_table(path).to_pylist()
        result[name] = summary(samples, credits, args.batches)
        if args.reference:
            result[name]["agreement"] = judged(samples, credits, args.reference, args.batches)
    for name, figures in result.items():
        cells = "  ".join(f"{m} {figures[m]:.3f}" if figures[m] is not None else f"{m} -" for m in MEASURES)
        print(f"{name:>24}: {figures['completions']} completions  {cells}")
    if args.reference:
        segments = pq.read_table(args.credits[0].partition("=")[2]).to_pylist()
        for control in CONTROLS:
            result[f"control:{control}"] = {"agreement": judged(samples, segments, args.reference, args.batches,
                                                                control=control)}
        print(f"{'':>24}  {'value ρ inner':>28}  {'value ρ | R':>28}   (mean [95% interval] over batches)")
        for name, figures in result.items():
            over = figures["agreement"]["over_batches"]
            print(f"{name:>24}: {_interval(over['value_spearman_inner']):>28}  "
                  f"{_interval(over['value_spearman_within']):>28}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
