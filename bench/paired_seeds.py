"""Paired differences in final held-out pass@1 between methods, over seeds and over several study
folders pooled (each pair within one folder: same seed, same machine), with 95% Student-t intervals.

    python bench/paired_seeds.py results/real-model/runs results/real-model-h200/runs \
        --methods rredcot rloo --baseline grpo --out pooled.json

A study folder holds `<method>-lr<lr>-seed<s>/train/summary.json` (scripts/real_model_study.sh);
`eval_after.pass@1` is the figure compared. A seed counts for a method in a folder only when both it
and the baseline finished there. `rredcot report` pairs the runs of one folder; this pools folders.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rredcot_cli.metrics import mean_ci

RUN = re.compile(r"^(?P<method>.+?)-lr.+-seed(?P<seed>\d+)$")


def final_pass1(folder: Path) -> dict[tuple[str, int], float]:
    out = {}
    for summary in sorted(folder.glob("*/train/summary.json")):
        match = RUN.match(summary.parent.parent.name)
        if match:
            out[(match["method"], int(match["seed"]))] = json.loads(summary.read_text())["eval_after"]["pass@1"]
    if not out:
        raise SystemExit(f"{folder}: no <method>-lr<lr>-seed<s>/train/summary.json there")
    return out


def interval(diffs: list[float]) -> dict:
    """Mean and 95% Student-t interval (rredcot_cli.metrics.mean_ci, as `rredcot report`)."""
    mean, low, high = mean_ci(diffs)
    return {"pairs": len(diffs), "mean": round(mean, 4), "low": round(low, 4), "high": round(high, 4)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="study folders of run folders")
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--baseline", default="grpo")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    report = {"bench": "paired_seeds", "baseline": args.baseline, "methods": {}}
    for method in args.methods:
        per_folder, pooled = {}, []
        for folder in args.folders:
            runs = final_pass1(Path(folder))
            diffs = {s: runs[(method, s)] - runs[(args.baseline, s)]
                     for (m, s) in runs if m == method and (args.baseline, s) in runs}
            per_folder[folder] = {"diffs": {s: round(d, 4) for s, d in sorted(diffs.items())},
                                  **(interval(list(diffs.values())) if len(diffs) > 1 else {"pairs": len(diffs)})}
            pooled += list(diffs.values())
        report["methods"][method] = {"folders": per_folder, "pooled": interval(pooled)}
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return report


if __name__ == "__main__":
    main()
