"""Headroom of a setting before RL: is there something to learn, and something to redistribute?

    python bench/headroom.py EVAL_PARQUET [--tail-lines 4] [--out headroom.json]

EVAL_PARQUET is the `eval.parquet` of `rredcot eval ... eval.n=8` (every problem sampled n times).
Prints and writes: sampled pass@1 (mean reward) and pass@n (share of problems with a correct
sample); the share of *mixed* groups (problems whose n samples are neither all right nor all wrong:
the only groups where GRPO's advantage is not zero); mean newline segments per completion (the
non-blank lines, what `segment=newline` cuts); for `chain_tail`, the share of completions in the
format (an `Answer:` line followed by exactly `--tail-lines` `Note:` lines) and the mean number of
lines after the Answer line; and the mean completion length in tokens.

Reads only the artifact; deterministic.
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


def headroom(rows: list[dict], tail_lines: int) -> dict:
    groups = collections.defaultdict(list)
    for row in rows:
        groups[row["prompt_id"]].append(float(row["correct"] or 0.0))
    tails = [lines_after_answer(r["completion"]) for r in rows]
    in_format = [t is not None and len(t) == tail_lines and all(x.startswith("Note: ") for x in t) for t in tails]
    return {
        "problems": len(groups),
        "samples_per_problem": sorted({len(g) for g in groups.values()}),
        "pass@1": sum(sum(g) for g in groups.values()) / len(rows),
        "pass@n": sum(any(g) for g in groups.values()) / len(groups),
        "mixed_group_share": sum(0 < sum(g) < len(g) for g in groups.values()) / len(groups),
        "mean_newline_segments": sum(len([x for x in r["completion"].split("\n") if x.strip()]) for r in rows) / len(rows),
        "mean_lines_after_answer": sum(len(t) for t in tails if t is not None) / max(1, sum(t is not None for t in tails)),
        "answer_line_share": sum(t is not None for t in tails) / len(rows),
        "tail_format_share": sum(in_format) / len(rows),
        "mean_tokens": sum(int(r["num_tokens"]) for r in rows) / len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval_parquet", type=Path)
    parser.add_argument("--tail-lines", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = headroom(pq.read_table(args.eval_parquet).to_pylist(), args.tail_lines)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
