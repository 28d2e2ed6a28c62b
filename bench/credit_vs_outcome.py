"""How a credit method's token advantages differ from GRPO's outcome advantage on the rollouts a
`rredcot train` run saved (`train.save_rollouts`): where the credit went, in three numbers.

    python bench/credit_vs_outcome.py RUN [RUN ...] [--method rredcot] [--out credit.json]

RUN is a `rredcot train` run folder (or its `train/`) with `rollouts/step-*/` holding the sample,
segment and `attribute/<method>/` artifacts. For every saved batch, the completions of groups whose
rewards are not all equal (GRPO gives the others 0, as the method does) are compared with GRPO's
advantage on the same rewards (`grpo_advantage`: group mean, Bessel std, eps 1e-6):

- `multi_segment_share`: the share of those completions with two or more segments (the only ones a
  segment-level method can treat differently from one another inside);
- `opposite_sign_segments` / `zero_segments`: over the segments of multi-segment completions, the
  share whose mean token advantage has the opposite sign to the completion's GRPO advantage, and
  the share whose advantage is zero (|mean| < 1e-9: no push either way); GRPO: 0 and 0 by
  construction;
- `push_ratio`: per completion, the sum of its token advantages over GRPO's (its advantage x its
  token count): how hard the update pushes that completion, relative to GRPO (median and 10th/90th
  percentiles, one-segment and multi-segment completions apart). For RREDCoT's default `immediate`
  rule a segment gets its own share of R - V(S_0), divided by the std of the group's segment rewards,
  so a multi-segment completion's tokens share the outcome instead of each carrying all of it.
- `reward_one_segment` / `reward_multi_segment`: the mean reward of one- and multi-segment
  completions over every group (mixed or not): which kind of answer the push would favour.

Reads only what the run wrote; deterministic; no timing.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from rredcot_cli.methods.grpo import grpo_advantage


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def batch_stats(step: Path, method: str) -> dict:
    """One saved batch -> lists of per-completion and per-segment figures."""
    samples = _rows(step / "sample" / "samples.parquet")
    segments = collections.defaultdict(list)
    for seg in _rows(step / "segment" / "segments.parquet"):
        segments[(seg["prompt_id"], seg["sample_idx"])].append((seg["token_start"], seg["token_end"]))
    advantages = {(a["prompt_id"], a["sample_idx"]): np.asarray(a["token_advantages"], dtype=np.float64)
                  for a in _rows(step / "attribute" / method / "advantages.parquet")}
    groups = {pid: i for i, pid in enumerate(dict.fromkeys(s["prompt_id"] for s in samples))}
    rewards = torch.tensor([float(s["reward"]) for s in samples], dtype=torch.float64)
    group_ids = torch.tensor([groups[s["prompt_id"]] for s in samples])
    outcome = grpo_advantage(rewards, group_ids, scale_by_std=True, eps=1e-6).tolist()
    out = {"completions": 0, "multi_segment": 0, "segments": 0, "opposite": 0, "zero": 0, "push_one": [],
           "push_multi": [], "reward_one": [], "reward_multi": []}
    for sample, grpo in zip(samples, outcome):
        spans_all = [(b, e) for b, e in segments[(sample["prompt_id"], sample["sample_idx"])] if e > b]
        out["reward_multi" if len(spans_all) >= 2 else "reward_one"].append(float(sample["reward"]))
        if grpo == 0.0:  # a group whose rewards are all equal (or a reward at its group's mean)
            continue
        key = (sample["prompt_id"], sample["sample_idx"])
        tokens = advantages[key]
        spans = [(b, e) for b, e in sorted(segments[key]) if e > b]
        out["completions"] += 1
        push = float(tokens.sum() / (grpo * len(tokens))) if len(tokens) else float("nan")
        if len(spans) >= 2:
            out["multi_segment"] += 1
            out["push_multi"].append(push)
            for b, e in spans:
                mean = float(tokens[b:e].mean())
                out["segments"] += 1
                out["zero"] += int(abs(mean) < 1e-9)
                out["opposite"] += int(abs(mean) >= 1e-9 and np.sign(mean) == -np.sign(grpo))
        else:
            out["push_one"].append(push)
    return out


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q10, q50, q90 = np.nanpercentile(values, [10, 50, 90])
    return {"n": len(values), "median": round(float(q50), 4), "q10": round(float(q10), 4), "q90": round(float(q90), 4)}


def _mean(values: list[float]) -> dict:
    return {"n": len(values), "mean": round(float(np.mean(values)), 4) if values else None}


def run_stats(run: Path, method: str) -> dict:
    train = run / "train" if (run / "train").is_dir() else run
    steps = sorted((train / "rollouts").glob("step-*"))
    steps = [s for s in steps if (s / "attribute" / method / "advantages.parquet").is_file()]
    if not steps:
        raise SystemExit(f"{run}: no rollouts/step-*/attribute/{method}/ there; train with "
                         f"method={method} and train.save_rollouts > 0")
    total = collections.Counter()
    lists = collections.defaultdict(list)
    for step in steps:
        stats = batch_stats(step, method)
        for name in ("push_one", "push_multi", "reward_one", "reward_multi"):
            lists[name] += stats.pop(name)
        total.update(stats)
    return {
        "run": str(run), "method": method, "batches": [s.name for s in steps],
        "completions_in_mixed_groups": total["completions"],
        "multi_segment_share": round(total["multi_segment"] / max(total["completions"], 1), 4),
        "segments_of_multi_segment_completions": total["segments"],
        "opposite_sign_segments": round(total["opposite"] / max(total["segments"], 1), 4),
        "zero_segments": round(total["zero"] / max(total["segments"], 1), 4),
        "push_ratio_one_segment": _quantiles(lists["push_one"]),
        "push_ratio_multi_segment": _quantiles(lists["push_multi"]),
        "reward_one_segment": _mean(lists["reward_one"]), "reward_multi_segment": _mean(lists["reward_multi"]),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="`rredcot train` run folders with saved rollouts")
    p.add_argument("--method", default="rredcot", help="the attribute/<method>/ folder read (default rredcot)")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    report = {"bench": "credit_vs_outcome", "runs": [run_stats(Path(r), args.method) for r in args.runs]}
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return report


if __name__ == "__main__":
    main()
