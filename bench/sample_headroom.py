"""Headroom of a sampled run (issue 39 item 5's check before a credit study): pass@1, pass@n, the
mean number of newline segments (non-empty lines) per completion, and the share of prompt groups
with mixed rewards, from a `rredcot sample` folder's samples.parquet (bench/headroom.py reads an eval.parquet instead,
with the chain_tail format checks).

    python bench/sample_headroom.py runs/ml/sample/samples.parquet [--segments runs/ml/segment/segments.parquet] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import pyarrow.parquet as pq


def headroom(samples: list[dict], segment_counts: list[int] | None = None) -> dict:
    groups: dict[str, list[float]] = defaultdict(list)
    for row in samples:
        groups[row["prompt_id"]].append(float(row["reward"] or 0.0))
    lines = [len([line for line in row["completion"].split("\n") if line.strip()]) for row in samples]
    out = {
        "prompts": len(groups),
        "completions": len(samples),
        "pass@1": sum(sum(r) for r in groups.values()) / len(samples),
        f"pass@{max(len(r) for r in groups.values())}": sum(max(r) > 0 for r in groups.values()) / len(groups),
        "mixed_group_share": sum(0 < sum(r) < len(r) for r in groups.values()) / len(groups),
        "mean_nonempty_lines": sum(lines) / len(lines),
        "share_with_answer_line": sum(row["pred_answer"] is not None for row in samples) / len(samples),
        "share_truncated": sum(row["finish_reason"] == "length" for row in samples) / len(samples),
        "mean_tokens": sum(row["num_tokens"] for row in samples) / len(samples),
    }
    if segment_counts is not None:
        out["mean_segments (segment stage)"] = sum(segment_counts) / len(segment_counts)
        out["share_with_>=3_segments"] = sum(c >= 3 for c in segment_counts) / len(segment_counts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("samples")
    parser.add_argument("--segments")
    parser.add_argument("--out")
    args = parser.parse_args()
    samples = pq.read_table(args.samples).to_pylist()
    counts = None
    if args.segments:
        per_completion: dict[tuple, int] = defaultdict(int)
        for row in pq.read_table(args.segments, columns=["prompt_id", "sample_idx"]).to_pylist():
            per_completion[(row["prompt_id"], row["sample_idx"])] += 1
        counts = list(per_completion.values())
    result = headroom(samples, counts)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
