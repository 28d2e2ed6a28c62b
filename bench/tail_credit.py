"""How much credit does each method put on the segments that cannot change the outcome? (issue 39, item 5)

    python bench/tail_credit.py SEGMENTS ATTRIBUTE [ATTRIBUTE ...] [--reference REF] [--batches 5] [--out tail.json]

SEGMENTS is a `rredcot segment` artifact (segments.parquet) of `benchmark=chain_tail` traces; each
ATTRIBUTE is `NAME=DIR`, the folder where `rredcot attribute method=NAME` wrote `credits.parquet`
(segment values and credits) and `advantages.parquet` (token advantages) on those traces. A
completion's *tail* is its segments after the first segment that starts with `Answer:` (the graded
line): text that cannot change the reward, so a good estimator credits it with ~0 while an
outcome-level advantage (GRPO) hands every tail token the whole outcome's advantage.

Per method, over every completion with a tail:

- `tail_abs_advantage` / `step_abs_advantage`: mean |token advantage| over tail tokens / over the
  tokens up to and including the Answer line (what the policy gradient trains on);
- `tail_advantage_share`: the tail's share of the summed |token advantage| (its share of tokens,
  `tail_token_share`, is what a constant advantage puts there);
- `tail_abs_credit` / `step_abs_credit`: mean |segment credit| over tail / other segments;
- each per batch (contiguous runs of whole prompt groups, as `rredcot judge judge.batches=N` cuts
  them) with the mean and 95% Student-t interval over batches.

With `--reference` (the judge's kept Monte Carlo reference, `<run.dir>/mc-reference/<key>.parquet`)
it also gives the reference's own tail credit, V(S_k) - V(S_k-1) over tail segments (0 by
construction for continuations that cannot change the answer: the check that the tail is inert).

Reads only the artifacts; deterministic; no timing.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import pyarrow.parquet as pq

from rredcot_cli.metrics import mean_ci
from rredcot_cli.train.distributed import split_evenly  # how `rredcot judge` cuts its batches

ANSWER_PREFIX = "Answer:"


def tail_starts(segments: list[dict]) -> dict[tuple[str, int], tuple[int, int]]:
    """(prompt_id, sample_idx) -> (index of the first tail segment, its first token), for every
    completion whose Answer segment is followed by at least one segment."""
    by_completion = collections.defaultdict(list)
    for row in segments:
        by_completion[(row["prompt_id"], int(row["sample_idx"]))].append(row)
    out = {}
    for key, rows in by_completion.items():
        rows.sort(key=lambda r: int(r["segment_idx"]))
        answer = next((i for i, r in enumerate(rows) if r["text"].strip().startswith(ANSWER_PREFIX)), None)
        if answer is not None and answer + 1 < len(rows):
            out[key] = (answer + 1, int(rows[answer + 1]["token_start"]))
    return out


def batches_of(keys: list[tuple[str, int]], batches: int) -> list[set[tuple[str, int]]]:
    """The completions cut into ``batches`` contiguous runs of whole prompt groups (judge's cut)."""
    prompts = list(dict.fromkeys(p for p, _ in keys))
    return [{k for k in keys if k[0] in set(part)} for part in split_evenly(prompts, batches)]


def method_figures(folder: Path, tails: dict, batch_keys: list[set]) -> dict:
    """The tail figures of one attribute folder, pooled and per batch."""
    advantages = {(r["prompt_id"], int(r["sample_idx"])): r["token_advantages"]
                  for r in pq.read_table(folder / "advantages.parquet").to_pylist()}
    credits = collections.defaultdict(list)
    for r in pq.read_table(folder / "credits.parquet").to_pylist():
        credits[(r["prompt_id"], int(r["sample_idx"]))].append((int(r["segment_idx"]), r["credit"]))

    def figures(keys) -> dict:
        sums = collections.Counter()
        for key in keys:
            if key not in tails or key not in advantages:
                continue
            first_segment, first_token = tails[key]
            adv = [abs(a) for a in advantages[key]]
            sums["tail_adv"] += sum(adv[first_token:])
            sums["step_adv"] += sum(adv[:first_token])
            sums["tail_tokens"] += len(adv) - first_token
            sums["step_tokens"] += first_token
            for index, credit in credits.get(key, []):
                side = "tail" if index >= first_segment else "step"
                sums[f"{side}_credit"] += abs(credit or 0.0)
                sums[f"{side}_segments"] += 1
        total_adv = sums["tail_adv"] + sums["step_adv"]
        tokens = sums["tail_tokens"] + sums["step_tokens"]
        return {
            "tail_abs_advantage": sums["tail_adv"] / sums["tail_tokens"] if sums["tail_tokens"] else None,
            "step_abs_advantage": sums["step_adv"] / sums["step_tokens"] if sums["step_tokens"] else None,
            "tail_advantage_share": sums["tail_adv"] / total_adv if total_adv else None,
            "tail_token_share": sums["tail_tokens"] / tokens if tokens else None,
            "tail_abs_credit": sums["tail_credit"] / sums["tail_segments"] if sums["tail_segments"] else None,
            "step_abs_credit": sums["step_credit"] / sums["step_segments"] if sums["step_segments"] else None,
        }

    pooled = figures(set().union(*batch_keys))
    per_batch = [figures(keys) for keys in batch_keys]
    return {"pooled": pooled, "per_batch": per_batch, "ci95_over_batches": intervals(per_batch)}


def intervals(per_batch: list[dict]) -> dict:
    """Mean and 95% interval over batches of every figure (batches where it is defined)."""
    out = {}
    for name in per_batch[0]:
        values = [b[name] for b in per_batch if b[name] is not None]
        out[name] = list(mean_ci(values)) if values else None
    return out


def reference_figures(path: Path, tails: dict, batch_keys: list[set]) -> dict:
    """Mean |V(S_k) - V(S_k-1)| of the Monte Carlo reference over tail and other segments."""
    rows = {(r["prompt_id"], int(r["sample_idx"])): r["values"] for r in pq.read_table(path).to_pylist()}

    def figures(keys) -> dict:
        sums = collections.Counter()
        for key in keys:
            if key not in tails or key not in rows:
                continue
            values = rows[key]
            for k in range(1, len(values)):
                side = "tail" if k - 1 >= tails[key][0] else "step"
                sums[f"{side}_credit"] += abs(values[k] - values[k - 1])
                sums[f"{side}_segments"] += 1
        return {"tail_abs_credit": sums["tail_credit"] / sums["tail_segments"] if sums["tail_segments"] else None,
                "step_abs_credit": sums["step_credit"] / sums["step_segments"] if sums["step_segments"] else None}

    per_batch = [figures(keys) for keys in batch_keys]
    return {"pooled": figures(set().union(*batch_keys)), "per_batch": per_batch,
            "ci95_over_batches": intervals(per_batch)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("segments", type=Path)
    parser.add_argument("attributes", nargs="+", help="NAME=DIR of a `rredcot attribute` output")
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    segments = pq.read_table(args.segments).to_pylist()
    tails = tail_starts(segments)
    keys = list(dict.fromkeys((r["prompt_id"], int(r["sample_idx"])) for r in segments))
    batch_keys = batches_of(keys, args.batches)
    result = {"completions": len(keys), "with_tail": len(tails), "batches": args.batches, "methods": {}}
    for spec in args.attributes:
        name, _, folder = spec.partition("=")
        if not folder:
            parser.error(f"{spec}: give NAME=DIR (e.g. grpo=runs/x/attribute-grpo/grpo)")
        result["methods"][name] = method_figures(Path(folder), tails, batch_keys)
    if args.reference:
        result["reference"] = reference_figures(args.reference, tails, batch_keys)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    for name, figures in result["methods"].items():
        pooled = figures["pooled"]
        print(f"{name:<10} " + "  ".join(f"{k} {v:.4f}" for k, v in pooled.items() if v is not None))
    if "reference" in result:
        print("reference  " + "  ".join(f"{k} {v:.4f}" for k, v in result["reference"]["pooled"].items() if v is not None))


if __name__ == "__main__":
    main()
