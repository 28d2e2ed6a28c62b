"""Paired differences in final held-out pass@1 between methods, over seeds and over several study
folders pooled (each pair within one folder, same seed), with 95% Student-t intervals.

    python bench/paired_seeds.py results/real-model/runs results/real-model-h200/runs \
        --methods rredcot rloo --baseline grpo --out pooled.json

A study folder holds `<method>-lr<lr>-seed<s>/train/summary.json` (scripts/real_model_study.sh);
`eval_after.pass@1` is the figure compared. A seed counts for a method in a folder only when both it
and the baseline finished there. `rredcot report` pairs the runs of one folder; this pools folders.

A pair is a common-random-number pair only when both runs ran the same code: a pair whose manifests
(`train/manifest.json`, `git.sha`) name different commits, or none, is refused in one line (exit
status 2) unless `--allow-mixed-commits`, which keeps it and lists it under `mixed_commits`. A pair
whose runs ran on different CPUs (the manifests' `machine`, where recorded) is kept, said in a note
and listed under `cross_machine`: runs are bit-identical only on one kind of CPU
(docs/failure-modes.md, Determinism), so such a pair shares the design, not the numbers.

Endpoints (`--endpoint`): `final`, the last held-out pass@1 (`eval_after`); `mean-eval`, the mean
of the held-out pass@1 evals after training began (every `train.eval_every` steps and the last one,
from `metrics.parquet`'s `eval_accuracy` and `eval_after`; the eval before training is left out: it
is the same model in both arms): the area under the eval curve, i.e. sample efficiency. Every run of
a folder must have evaluated at the same steps, or the means would not be comparable (refused).

Each comparison's pooled differences also get (docs/studies/where-credit-pays.md registers them):
- `sign_flip_p`: the two-sided sign-flip permutation p-value of the mean difference, exact (all
  2^n flips) up to `EXACT_FLIPS_UP_TO` pairs, else `MONTE_CARLO_FLIPS` random flips (seed 0);
- `tost_p` at `--margin` m: two one-sided t tests of "the mean difference is <= -m" and ">= +m"
  (the larger p; below 0.05 the difference is equivalent to zero within +-m);
- `mde`: the difference the design detects with 80 % power at two-sided 5 %, (t_.975 + t_.80) x
  sd / sqrt(n) with the observed sd;
- `verdict`, one rule: "helps" when sign_flip_p < 0.05 and the mean is > 0; else "no gain beyond
  the margin" when the 95 % interval's upper end is < +m ("trails" added when sign_flip_p < 0.05
  and the mean is < 0, "equivalent" when tost_p < 0.05); else "unresolved".
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from rredcot_cli.metrics import mean_ci, t_quantile, t_upper_tail
from rredcot_cli.report.load import machines_of, machines_text, on_different_cpus

RUN = re.compile(r"^(?P<method>.+?)-lr.+-seed(?P<seed>\d+)$")
EXACT_FLIPS_UP_TO = 20  # 2^20 = 1,048,576 sign vectors: seconds with numpy
MONTE_CARLO_FLIPS = 200_000
ALPHA = 0.05
POWER = 0.80


def final_pass1(folder: Path) -> dict[tuple[str, int], float]:
    out = {}
    for summary in sorted(folder.glob("*/train/summary.json")):
        match = RUN.match(summary.parent.parent.name)
        if match:
            out[(match["method"], int(match["seed"]))] = json.loads(summary.read_text())["eval_after"]["pass@1"]
    if not out:
        raise SystemExit(f"{folder}: no <method>-lr<lr>-seed<s>/train/summary.json there")
    return out


def eval_curve(train: Path) -> dict[int, float]:
    """Step -> held-out pass@1 after training began: the in-training evals and the final one."""
    summary = json.loads((train / "summary.json").read_text())
    metrics = pq.read_table(train / "metrics.parquet", columns=["step", "eval_accuracy"]).to_pylist()
    curve = {int(row["step"]): float(row["eval_accuracy"]) for row in metrics if row["eval_accuracy"] is not None}
    curve[int(summary["steps"])] = float(summary["eval_after"]["pass@1"])
    return curve


def mean_eval_pass1(folder: Path) -> dict[tuple[str, int], float]:
    """Each run's mean held-out pass@1 over its eval steps (the area under its eval curve); every run
    of the folder must share the eval steps (one line, exit status 2, otherwise)."""
    curves = {}
    for summary in sorted(folder.glob("*/train/summary.json")):
        match = RUN.match(summary.parent.parent.name)
        if match:
            curves[(match["method"], int(match["seed"]))] = eval_curve(summary.parent)
    if not curves:
        raise SystemExit(f"{folder}: no <method>-lr<lr>-seed<s>/train/summary.json there")
    steps = {tuple(sorted(c)) for c in curves.values()}
    if len(steps) > 1:
        shown = "; ".join(f"{m}-seed{s}: {sorted(c)}" for (m, s), c in sorted(curves.items()))
        print(f"error: {folder}: runs evaluated at different steps ({shown}), so their mean evals are not "
              "comparable; rerun them with one train.steps and train.eval_every, or use --endpoint final",
              file=sys.stderr)
        raise SystemExit(2)
    return {key: sum(c.values()) / len(c) for key, c in curves.items()}


ENDPOINTS = {"final": final_pass1, "mean-eval": mean_eval_pass1}


def manifests(folder: Path) -> dict[tuple[str, int], dict]:
    """Each finished run's train manifest ({} where there is none)."""
    out = {}
    for summary in sorted(folder.glob("*/train/summary.json")):
        match = RUN.match(summary.parent.parent.name)
        manifest = summary.parent / "manifest.json"
        if match:
            out[(match["method"], int(match["seed"]))] = json.loads(manifest.read_text()) if manifest.is_file() else {}
    return out


def commits(folder: Path) -> dict[tuple[str, int], str | None]:
    """The git sha each run's train manifest records (None: not recorded, or no manifest)."""
    return {run: (manifest.get("git") or {}).get("sha") for run, manifest in manifests(folder).items()}


def machines(folder: Path) -> dict[tuple[str, int], tuple[str, ...]]:
    """The CPUs each run's attempts ran on, as ``cpu (capability)`` without repeats (empty: not recorded)."""
    return {run: machines_of(manifest) for run, manifest in manifests(folder).items()}


def cross_machine_pairs(folder: Path, method: str, baseline: str, seeds) -> list[dict]:
    """The pairs of ``seeds`` whose two runs recorded their CPUs and did not all run on one."""
    cpus = machines(folder)
    return [{"seed": s, method: machines_text(cpus[(method, s)]), baseline: machines_text(cpus[(baseline, s)])}
            for s in sorted(seeds) if on_different_cpus(cpus[(method, s)], cpus[(baseline, s)])]


def mixed_commit_pairs(folder: Path, method: str, baseline: str, seeds) -> list[dict]:
    """The pairs of ``seeds`` whose two runs are not on one recorded commit."""
    shas = commits(folder)
    return [{"seed": s, method: (shas[(method, s)] or "unknown")[:7], baseline: (shas[(baseline, s)] or "unknown")[:7]}
            for s in sorted(seeds) if shas[(method, s)] is None or shas[(method, s)] != shas[(baseline, s)]]


def interval(diffs: list[float]) -> dict:
    """Mean and 95% Student-t interval (rredcot_cli.metrics.mean_ci, as `rredcot report`)."""
    mean, low, high = mean_ci(diffs)
    return {"pairs": len(diffs), "mean": round(mean, 4), "low": round(low, 4), "high": round(high, 4)}


def sign_flip_p(diffs: list[float]) -> tuple[float, int | None]:
    """Two-sided sign-flip p of the mean difference and the Monte Carlo count (None: exact). Under
    "no difference" each pair's sign is a fair coin, so p is the share of sign vectors whose |sum|
    reaches the observed one (the observed vector counts itself)."""
    d = np.abs(np.asarray(diffs, dtype=np.float64))
    observed = abs(float(np.sum(diffs))) - 1e-12  # ties of floating sums count as reaching it
    if len(d) <= EXACT_FLIPS_UP_TO:
        hits = total = 0
        head, tail = d[: max(0, len(d) - 14)], d[max(0, len(d) - 14):]
        tail_sums = np.array([np.dot(signs, tail) for signs in itertools.product((1.0, -1.0), repeat=len(tail))])
        for signs in itertools.product((1.0, -1.0), repeat=len(head)):
            hits += int(np.count_nonzero(np.abs(np.dot(signs, head) + tail_sums) >= observed))
            total += len(tail_sums)
        return hits / total, None
    signs = np.random.default_rng(0).choice((1.0, -1.0), size=(MONTE_CARLO_FLIPS, len(d)))
    hits = int(np.count_nonzero(np.abs(signs @ d) >= observed))
    return (hits + 1) / (MONTE_CARLO_FLIPS + 1), MONTE_CARLO_FLIPS


def tost_p(diffs: list[float], margin: float) -> float:
    """Two one-sided t tests of equivalence within +-margin: the larger of the two p-values."""
    n = len(diffs)
    mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1)) / math.sqrt(n)
    if se == 0.0:
        return 0.0 if abs(mean) < margin else 1.0
    return max(t_upper_tail((mean + margin) / se, n - 1), 1.0 - t_upper_tail((mean - margin) / se, n - 1))


def mde(diffs: list[float]) -> float:
    """The mean difference detected with 80 % power by a two-sided 5 % paired t test at this n and sd."""
    n = len(diffs)
    sd = float(np.std(diffs, ddof=1))
    return (t_quantile(1 - ALPHA, n - 1) + t_quantile(2 * POWER - 1, n - 1)) * sd / math.sqrt(n)


def verdict(mean: float, high: float, p_flip: float, p_tost: float, margin: float) -> str:
    """The registered one-line verdict (docs/studies/where-credit-pays.md)."""
    if p_flip < ALPHA and mean > 0:
        return "helps"
    if high < margin:
        notes = [word for word, on in (("trails", p_flip < ALPHA and mean < 0), ("equivalent", p_tost < ALPHA)) if on]
        return "no gain beyond the margin" + (f" ({', '.join(notes)})" if notes else "")
    return "unresolved"


def tests(diffs: list[float], margin: float) -> dict:
    """The interval, sign-flip p, TOST p, detectable effect and verdict of one set of paired differences."""
    out = interval(diffs)
    if len(diffs) < 2:
        return out
    p_flip, flips = sign_flip_p(diffs)
    p_tost = tost_p(diffs, margin)
    out.update({"sd": round(float(np.std(diffs, ddof=1)), 4), "sign_flip_p": round(p_flip, 6),
                "sign_flip": "exact" if flips is None else f"monte carlo, {flips} flips",
                "margin": margin, "tost_p": round(p_tost, 6), "mde": round(mde(diffs), 4),
                "verdict": verdict(out["mean"], out["high"], p_flip, p_tost, margin)})
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="study folders of run folders")
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--baseline", default="grpo")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="final",
                   help="final: the last held-out pass@1; mean-eval: the mean over the eval steps (default final)")
    p.add_argument("--margin", type=float, default=0.03, help="equivalence margin of the TOST and the verdict (default 0.03)")
    p.add_argument("--allow-mixed-commits", action="store_true",
                   help="keep pairs whose runs ran on different (or unrecorded) commits, listed under mixed_commits")
    args = p.parse_args(argv)
    if not args.margin > 0:
        p.error(f"--margin must be > 0, got {args.margin}")
    report = {"bench": "paired_seeds", "baseline": args.baseline, "endpoint": args.endpoint, "methods": {}}
    for method in args.methods:
        per_folder, pooled = {}, []
        for folder in args.folders:
            runs = ENDPOINTS[args.endpoint](Path(folder))
            diffs = {s: runs[(method, s)] - runs[(args.baseline, s)]
                     for (m, s) in runs if m == method and (args.baseline, s) in runs}
            mixed = mixed_commit_pairs(Path(folder), method, args.baseline, diffs)
            if mixed and not args.allow_mixed_commits:
                shown = ", ".join(f"seed {m['seed']}: {m[method]} vs {m[args.baseline]}" for m in mixed)
                print(f"error: {folder}: {method} vs {args.baseline} pairs ran on different or unknown commits "
                      f"({shown}), so they are not common-random-number pairs; rerun both arms at one commit, or "
                      "pass --allow-mixed-commits to keep them (listed under mixed_commits)", file=sys.stderr)
                raise SystemExit(2)
            crossed = cross_machine_pairs(Path(folder), method, args.baseline, diffs)
            if crossed:
                print(f"note: {folder}: {method} vs {args.baseline}: {len(crossed)} of {len(diffs)} pairs ran on "
                      "different CPUs (listed under cross_machine); kept: unbiased, but not bit-identical pairs",
                      file=sys.stderr)
            per_folder[folder] = {"diffs": {s: round(d, 4) for s, d in sorted(diffs.items())},
                                  **(interval(list(diffs.values())) if len(diffs) > 1 else {"pairs": len(diffs)}),
                                  **({"mixed_commits": mixed} if mixed else {}),
                                  **({"cross_machine": crossed} if crossed else {})}
            pooled += list(diffs.values())
        report["methods"][method] = {"folders": per_folder, "pooled": tests(pooled, args.margin)}
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return report


if __name__ == "__main__":
    main()
