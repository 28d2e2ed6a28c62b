"""Paired differences in final held-out pass@1 between methods, over seeds and over several study
folders pooled (each pair within one folder: same seed, same machine), with 95% Student-t intervals.

    python bench/paired_seeds.py results/real-model/runs results/real-model-h200/runs \
        --methods rredcot rloo --baseline grpo --out pooled.json

A study folder holds `<method>-lr<lr>-seed<s>/train/summary.json` (scripts/real_model_study.sh);
`eval_after.pass@1` is the figure compared. A seed counts for a method in a folder only when both it
and the baseline finished there. `rredcot report` pairs the runs of one folder; this pools folders.

A pair is a common-random-number pair only when both runs ran the same code: a pair whose manifests
(`train/manifest.json`, `git.sha`) name different commits, or none, is refused in one line (exit
status 2) unless `--allow-mixed-commits`, which keeps it and lists it under `mixed_commits`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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


def commits(folder: Path) -> dict[tuple[str, int], str | None]:
    """The git sha each run's train manifest records (None: not recorded, or no manifest)."""
    out = {}
    for summary in sorted(folder.glob("*/train/summary.json")):
        match = RUN.match(summary.parent.parent.name)
        manifest = summary.parent / "manifest.json"
        if match:
            git = (json.loads(manifest.read_text()).get("git") or {}) if manifest.is_file() else {}
            out[(match["method"], int(match["seed"]))] = git.get("sha")
    return out


def mixed_commit_pairs(folder: Path, method: str, baseline: str, seeds) -> list[dict]:
    """The pairs of ``seeds`` whose two runs are not on one recorded commit."""
    shas = commits(folder)
    return [{"seed": s, method: (shas[(method, s)] or "unknown")[:7], baseline: (shas[(baseline, s)] or "unknown")[:7]}
            for s in sorted(seeds) if shas[(method, s)] is None or shas[(method, s)] != shas[(baseline, s)]]


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
    p.add_argument("--allow-mixed-commits", action="store_true",
                   help="keep pairs whose runs ran on different (or unrecorded) commits, listed under mixed_commits")
    args = p.parse_args(argv)
    report = {"bench": "paired_seeds", "baseline": args.baseline, "methods": {}}
    for method in args.methods:
        per_folder, pooled = {}, []
        for folder in args.folders:
            runs = final_pass1(Path(folder))
            diffs = {s: runs[(method, s)] - runs[(args.baseline, s)]
                     for (m, s) in runs if m == method and (args.baseline, s) in runs}
            mixed = mixed_commit_pairs(Path(folder), method, args.baseline, diffs)
            if mixed and not args.allow_mixed_commits:
                shown = ", ".join(f"seed {m['seed']}: {m[method]} vs {m[args.baseline]}" for m in mixed)
                print(f"error: {folder}: {method} vs {args.baseline} pairs ran on different or unknown commits "
                      f"({shown}), so they are not common-random-number pairs; rerun both arms at one commit, or "
                      "pass --allow-mixed-commits to keep them (listed under mixed_commits)", file=sys.stderr)
                raise SystemExit(2)
            per_folder[folder] = {"diffs": {s: round(d, 4) for s, d in sorted(diffs.items())},
                                  **(interval(list(diffs.values())) if len(diffs) > 1 else {"pairs": len(diffs)}),
                                  **({"mixed_commits": mixed} if mixed else {})}
            pooled += list(diffs.values())
        report["methods"][method] = {"folders": per_folder, "pooled": interval(pooled)}
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return report


if __name__ == "__main__":
    main()
