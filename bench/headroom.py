"""Headroom of a setting before RL: is there something to learn, and something to redistribute?

    python bench/headroom.py EVAL_PARQUET [--tail-lines 4] [--out headroom.json]
    python bench/headroom.py SAMPLES_PARQUET [--segments SEGMENTS_PARQUET] [--out headroom.json]

Both artifacts hold every problem sampled n times; the script tells them apart by their columns.
From either: sampled pass@1 (mean reward) and pass@n (share of problems with a correct sample); the
share of *mixed* groups (problems whose n samples are neither all right nor all wrong: the only
groups where GRPO's advantage is not zero); the mean number of non-blank lines per completion (what
`segment=newline` cuts); and the mean completion length in tokens.

- An `eval.parquet` (`rredcot eval ... eval.n=8`) adds, for `chain_tail`, the share of completions
  in the format (an `Answer:` line followed by exactly `--tail-lines` `Note:` lines) and the mean
  number of lines after the Answer line.
- A `samples.parquet` (a `rredcot sample` folder) adds the share with a graded answer and the share
  truncated; with `--segments` (that run's `segments.parquet`) the mean segments per completion
  and the share with three or more.

Reads only the artifacts; deterministic.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import pyarrow.parquet as pq


def lines_after_answer(completion: str) -> list[str] | None:
    """The non-blank lines after the first ``Answer:`` line, None without one."""
    lines = [line for line in completion.split("\n") if line.strip()]
    at = next((i for i, line in enumerate(lines) if line.strip().startswith("Answer:")), None)
    return None if at is None else lines[at + 1:]


def nonblank_lines(completion: str) -> int:
    return len([line for line in completion.split("\n") if line.strip()])


def groups_of(rows: list[dict], outcome: str) -> dict[str, list[float]]:
    """Each prompt's outcomes (column ``outcome``: eval's ``correct``, sample's ``reward``; null as 0)."""
    groups: dict[str, list[float]] = collections.defaultdict(list)
    for row in rows:
        groups[row["prompt_id"]].append(float(row[outcome] or 0.0))
    return groups


def pass_rates(groups: dict[str, list[float]]) -> tuple[float, float, float]:
    """pass@1 (mean outcome), pass@n (share of prompts with a success) and the share of mixed groups."""
    samples = sum(len(g) for g in groups.values())
    return (sum(sum(g) for g in groups.values()) / samples,
            sum(max(g) > 0 for g in groups.values()) / len(groups),
            sum(0 < sum(g) < len(g) for g in groups.values()) / len(groups))


def headroom(rows: list[dict], tail_lines: int) -> dict:
    """The figures of an eval.parquet's rows."""
    groups = groups_of(rows, "correct")
    pass1, passn, mixed = pass_rates(groups)
    tails = [lines_after_answer(r["completion"]) for r in rows]
    in_format = [t is not None and len(t) == tail_lines and all(x.startswith("Note: ") for x in t) for t in tails]
    return {
        "problems": len(groups),
        "samples_per_problem": sorted({len(g) for g in groups.values()}),
        "pass@1": pass1,
        "pass@n": passn,
        "mixed_group_share": mixed,
        "mean_newline_segments": sum(nonblank_lines(r["completion"]) for r in rows) / len(rows),
        "mean_lines_after_answer": sum(len(t) for t in tails if t is not None) / max(1, sum(t is not None for t in tails)),
        "answer_line_share": sum(t is not None for t in tails) / len(rows),
        "tail_format_share": sum(in_format) / len(rows),
        "mean_tokens": sum(int(r["num_tokens"]) for r in rows) / len(rows),
    }


def sample_headroom(samples: list[dict], segment_counts: list[int] | None = None) -> dict:
    """The figures of a samples.parquet's rows (and the segment stage's count per completion)."""
    groups = groups_of(samples, "reward")
    pass1, passn, mixed = pass_rates(groups)
    lines = [nonblank_lines(row["completion"]) for row in samples]
    out = {
        "prompts": len(groups),
        "completions": len(samples),
        "pass@1": pass1,
        f"pass@{max(len(g) for g in groups.values())}": passn,
        "mixed_group_share": mixed,
        "mean_nonempty_lines": sum(lines) / len(lines),
        "share_with_answer_line": sum(row["pred_answer"] is not None for row in samples) / len(samples),
        "share_truncated": sum(row["finish_reason"] == "length" for row in samples) / len(samples),
        "mean_tokens": sum(row["num_tokens"] for row in samples) / len(samples),
    }
    if segment_counts is not None:
        out["mean_segments (segment stage)"] = sum(segment_counts) / len(segment_counts)
        out["share_with_>=3_segments"] = sum(c >= 3 for c in segment_counts) / len(segment_counts)
    return out


def segment_counts(path: Path) -> list[int]:
    per_completion: dict[tuple, int] = collections.defaultdict(int)
    for row in pq.read_table(path, columns=["prompt_id", "sample_idx"]).to_pylist():
        per_completion[(row["prompt_id"], row["sample_idx"])] += 1
    return list(per_completion.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", type=Path, help="an eval.parquet or a samples.parquet")
    parser.add_argument("--tail-lines", type=int, default=4, help="eval.parquet: Note: lines the chain_tail format has")
    parser.add_argument("--segments", type=Path, help="samples.parquet: the same run's segments.parquet")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    table = pq.read_table(args.parquet)
    if "correct" in table.column_names:
        if args.segments:
            parser.error("--segments goes with a samples.parquet; this is an eval.parquet")
        result = headroom(table.to_pylist(), args.tail_lines)
    elif "reward" in table.column_names:
        result = sample_headroom(table.to_pylist(), segment_counts(args.segments) if args.segments else None)
    else:
        parser.error(f"{args.parquet}: neither an eval.parquet (no 'correct' column) nor a samples.parquet "
                     "(no 'reward' column)")
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
