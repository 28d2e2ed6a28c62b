"""A learning-rate sweep that is fair by construction: every method trains on the same rate grid, at
the same tuning seeds, with the same overrides (so the same budget), and each method's rate is
picked by one stated rule from those runs alone.

    python scripts/lr_sweep.py --methods grpo rredcot --lrs 1e-5 3e-5 1e-4 \\
        --tuning-seeds 100 101 102 --eval-seeds 0 1 2 3 4 -- benchmark.min_steps=14 train.steps=30

- **Seeds.** The tuning seeds must be disjoint from the evaluation seeds the comparison will use
  (``--eval-seeds``; an overlap is refused): a rate picked on the seeds it is then judged on would
  be fitted to their noise. Each run also draws its training prompts in an order of its own
  (``train.data_order_seed`` = its seed) unless ``--fixed-data-order``.
- **Budget.** Every run gets the overrides after ``--``, and only ``method``, ``train.lr``,
  ``seed`` (and ``train.data_order_seed``) vary, so steps, prompts, samples, tokens and evals are
  the same for every method; overrides of those keys are refused. Before picking, the runs'
  recorded budgets (``BUDGET_KEYS`` of each ``config.yaml``) are checked equal.
- **Rule.** A run's score is the mean of its last ``--last-evals`` held-out pass@1 evals (the
  eval before training left out); a rate's score is the mean over the tuning seeds; each method
  gets the rate with the highest score, a tie (within 1e-9) going to the smaller rate.
- **Resume.** Run dirs are ``OUT/<method>-lr<lr>-seed<seed>``; every run is started with
  ``train.resume=true``, so a finished one is skipped by ``rredcot train`` itself (same options)
  and an interrupted one continues from its last checkpoint. Rerun the same command after an
  interruption.
- **Output.** ``OUT/lr_sweep.json`` (the rule, the grid, every run's evals and score, each rate's
  score, the choice) and ``OUT/lr_sweep.md`` (the same as a table), ``OUT`` = ``runs/lr-sweep``
  by default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from rredcot_cli.report.load import load_run

RULE = ("score of a run = mean of its last {last} held-out pass@1 evals (the eval before training left out); "
        "score of a rate = mean over the tuning seeds; each method's rate = the highest score, ties (within "
        "1e-9) to the smaller rate")
TIE = 1e-9
# The sweep's own axes: an override of one of these would break the grid.
AXES = ("method", "train.lr", "seed", "train.data_order_seed", "run.dir", "train.resume")
# What makes a run's budget: equal in every run of a sweep.
BUDGET_KEYS = ("train.steps", "train.prompts_per_step", "sampling.n", "sampling.max_new_tokens",
               "train.updates_per_batch", "train.minibatch_size", "train.eval_every", "train.eval_problems",
               "train.eval_samples", "train.dynamic_sampling", "train.max_sampling_rounds", "benchmark")


class SweepError(Exception):
    """Bad input or a sweep that cannot pick: one line, exit status 2."""


# --------------------------------------------------------------------------- the grid


def check_grid(methods: list[str], lrs: list[float], tuning: list[int], evaluation: list[int],
               overrides: list[str]) -> None:
    """Refuse a grid that is not fair by construction (SweepError naming the fix)."""
    overlap = sorted(set(tuning) & set(evaluation))
    if overlap:
        raise SweepError(f"tuning seeds {overlap} are also evaluation seeds (--eval-seeds); pick tuning seeds "
                         "disjoint from them, e.g. 100 101 102")
    for name, values in (("--methods", methods), ("--lrs", lrs), ("--tuning-seeds", tuning)):
        if len(set(values)) != len(values):
            raise SweepError(f"{name} lists a value twice: {' '.join(map(str, values))}")
    if any(lr <= 0 for lr in lrs):
        raise SweepError(f"--lrs must be > 0, got {' '.join(map(str, lrs))}")
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in AXES:
            raise SweepError(f"override {override!r} sets one of the sweep's own axes ({', '.join(AXES)}); "
                             "give methods, rates and seeds with --methods, --lrs, --tuning-seeds")


def run_dir(out: Path, method: str, lr: float, seed: int) -> Path:
    return out / f"{method}-lr{lr:g}-seed{seed}"


def train_command(python: str, out: Path, method: str, lr: float, seed: int, overrides: list[str],
                  vary_data: bool) -> list[str]:
    """The ``rredcot train`` command of one cell: the shared overrides, then the cell's own axes."""
    axes = [f"method={method}", f"train.lr={lr:g}", f"seed={seed}", f"run.dir={run_dir(out, method, lr, seed)}",
            "train.resume=true"]
    if vary_data:
        axes.append(f"train.data_order_seed={seed}")
    return [python, "-m", "rredcot_cli", "train", *overrides, *axes]


def run_cells(cells: dict[str, list[str]], jobs: int, log_dir: Path) -> list[str]:
    """Run every cell's command (``jobs`` at a time), each appending to ``log_dir/<cell>.log``; the
    cells whose command failed. A rerun appends: a resumed cell's log keeps the lines of its first
    attempt, and a finished cell's keeps its training under the rerun's "up to date" line."""
    log_dir.mkdir(parents=True, exist_ok=True)

    def one(name: str) -> int:
        print(" ".join(cells[name]), flush=True)
        with open(log_dir / f"{name}.log", "a") as log:
            return subprocess.run(cells[name], stdout=log, stderr=subprocess.STDOUT).returncode

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        statuses = list(pool.map(one, cells))
    return [name for name, status in zip(cells, statuses) if status != 0]


# --------------------------------------------------------------------------- the rule


def run_score(curve: dict[int, float], last: int) -> float:
    """Mean of the last ``last`` held-out pass@1 evals of a run (step 0, before training, left out)."""
    after = [curve[step] for step in sorted(curve) if step > 0]
    if not after:
        raise SweepError("a run has no held-out eval after training")
    kept = after[-last:]
    return sum(kept) / len(kept)


def pick(scores: dict[str, dict[float, list[float]]]) -> dict[str, dict]:
    """Each method's rate by the rule: ``scores[method][lr]`` holds one run score per tuning seed.

    Returns ``{method: {"lr": chosen, "score": its mean, "by_lr": {lr: mean}}}``; the highest mean
    wins, a tie within ``TIE`` goes to the smaller rate."""
    chosen = {}
    for method, by_lr in scores.items():
        means = {lr: sum(values) / len(values) for lr, values in by_lr.items()}
        best = max(means.values())
        lr = min(rate for rate, mean in means.items() if mean >= best - TIE)
        chosen[method] = {"lr": lr, "score": means[lr], "by_lr": means}
    return chosen


# --------------------------------------------------------------------------- evidence


def _leaf(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def collect(out: Path, methods, lrs, seeds, last: int) -> tuple[list[dict], dict]:
    """Every run's record (evals, score, budget, commit) and ``scores[method][lr]`` per seed.
    SweepError when a run did not finish or the runs' budgets differ."""
    records, scores, unfinished = [], {}, []
    for method in methods:
        for lr in lrs:
            for seed in seeds:
                path = run_dir(out, method, lr, seed)
                manifest = path / "train" / "manifest.json"
                if not manifest.is_file() or json.loads(manifest.read_text()).get("status") != "complete":
                    unfinished.append(path.name)
                    continue
                run = load_run(path)
                config = yaml.safe_load((path / "train" / "config.yaml").read_text())
                score = run_score(run.curve, last)
                scores.setdefault(method, {}).setdefault(lr, []).append(score)
                records.append({"method": method, "lr": lr, "seed": seed, "run_dir": str(path),
                                "evals": {str(k): v for k, v in sorted(run.curve.items())}, "score": score,
                                "generated_tokens": run.summary.get("generated_tokens"), "commit": run.commit,
                                "budget": {key: _leaf(config, key) for key in BUDGET_KEYS}})
    if unfinished:
        raise SweepError(f"{len(unfinished)} run(s) did not finish ({', '.join(unfinished[:4])}"
                         f"{', ...' if len(unfinished) > 4 else ''}); their logs are in {out / 'logs'}; rerun the "
                         "same command to resume them")
    budgets = {json.dumps(r["budget"], sort_keys=True, default=str) for r in records}
    if len(budgets) > 1:
        raise SweepError(f"the runs in {out} differ in budget ({', '.join(BUDGET_KEYS)}); a sweep needs one budget: "
                         "use a fresh --out for other settings")
    return records, scores


def table(choice: dict, scores: dict, lrs: list[float]) -> str:
    """Markdown: a row per method, a column per rate (mean over seeds, per-seed scores), the pick in bold."""
    header = "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen |"
    rows = [header, "|" + " --- |" * (len(lrs) + 2)]
    for method, picked in choice.items():
        cells = []
        for lr in lrs:
            text = f"{picked['by_lr'][lr]:.3f} ({', '.join(f'{s:.3f}' for s in scores[method][lr])})"
            cells.append(f"**{text}**" if lr == picked["lr"] else text)
        rows.append(f"| {method} | " + " | ".join(cells) + f" | {picked['lr']:g} |")
    return "\n".join(rows)


def write_evidence(out: Path, args, overrides, records, scores, choice) -> None:
    rule = RULE.format(last=args.last_evals)
    commits = sorted({r["commit"] or "unknown" for r in records})
    evidence = {"rule": rule, "methods": args.methods, "lrs": args.lrs, "tuning_seeds": args.tuning_seeds,
                "eval_seeds": args.eval_seeds, "last_evals": args.last_evals, "overrides": overrides,
                "data_order": "fixed" if args.fixed_data_order else "train.data_order_seed = seed",
                "commits": commits, "runs": records,
                "choice": {m: {"lr": c["lr"], "score": c["score"], "by_lr": {f"{lr:g}": v for lr, v in c["by_lr"].items()}}
                           for m, c in choice.items()}}
    (out / "lr_sweep.json").write_text(json.dumps(evidence, indent=2) + "\n")
    text = "\n\n".join([
        "# Learning-rate sweep", f"Rule: {rule}.",
        f"Tuning seeds {', '.join(map(str, args.tuning_seeds))} (evaluation seeds "
        f"{', '.join(map(str, args.eval_seeds))} left out); overrides: `{' '.join(overrides) or 'none'}`; "
        f"commits: {', '.join(c[:7] for c in commits)}.",
        "Score per rate: mean over the tuning seeds (each seed's score in brackets); the chosen rate in bold.",
        table(choice, scores, args.lrs),
    ])
    (out / "lr_sweep.md").write_text(text + "\n")
    if len(commits) > 1:
        print(f"warning: the sweep's runs ran on {len(commits)} commits ({', '.join(c[:7] for c in commits)})",
              file=sys.stderr)


# --------------------------------------------------------------------------- command line


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--lrs", nargs="+", type=float, required=True, help="the rate grid, the same for every method")
    p.add_argument("--tuning-seeds", nargs="+", type=int, required=True)
    p.add_argument("--eval-seeds", nargs="+", type=int, required=True,
                   help="the seeds the comparison itself will use: refused as tuning seeds")
    p.add_argument("--last-evals", type=int, default=3, help="held-out evals averaged per run (default 3)")
    p.add_argument("--out", type=Path, default=Path("runs/lr-sweep"))
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--fixed-data-order", action="store_true",
                   help="every run draws prompts in the split's own order (default: train.data_order_seed = seed)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs `-m rredcot_cli train`")
    args = p.parse_args(argv)
    if args.last_evals < 1:
        p.error("--last-evals must be >= 1")
    return args, overrides


def main(argv: list[str] | None = None) -> dict:
    args, overrides = parse(argv)
    try:
        check_grid(args.methods, args.lrs, args.tuning_seeds, args.eval_seeds, overrides)
        args.lrs = sorted(args.lrs)
        cells = {run_dir(args.out, m, lr, s).name: train_command(args.python, args.out, m, lr, s, overrides,
                                                                 not args.fixed_data_order)
                 for m in args.methods for lr in args.lrs for s in args.tuning_seeds}
        failed = run_cells(cells, args.jobs, args.out / "logs")
        if failed:  # a cell refused (other options in its run dir) or crashed: no pick from a partial grid
            raise SweepError(f"{len(failed)} of {len(cells)} runs failed ({', '.join(failed[:4])}"
                             f"{', ...' if len(failed) > 4 else ''}); the last lines of "
                             f"{args.out / 'logs' / (failed[0] + '.log')} say why; fix it and rerun the same command "
                             "(finished runs are kept)")
        records, scores = collect(args.out, args.methods, args.lrs, args.tuning_seeds, args.last_evals)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    choice = pick(scores)
    write_evidence(args.out, args, overrides, records, scores, choice)
    print(table(choice, scores, args.lrs))
    print(f"{args.out / 'lr_sweep.json'}\n{args.out / 'lr_sweep.md'}")
    return {m: c["lr"] for m, c in choice.items()}


if __name__ == "__main__":
    main()
