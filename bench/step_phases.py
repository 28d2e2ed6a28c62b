"""Where the steps of finished `rredcot train` runs went, phase by phase, and each run's cost
against a baseline run (issue 27, item 4: RREDCoT / GRPO step time, value estimation / sampling
seconds).

    python bench/step_phases.py grpo=RUN_A rredcot=RUN_B --baseline grpo --out phases.json

Each RUN is a run folder (`run.dir`, or its `train/` folder) whose `train/metrics.parquet` has
the `seconds` and `seconds_<phase>` columns (rredcot_cli/train/steptime.py). Per phase: the
median over steps 2..N (step 1 carries one-time warm-up) and the sum over all steps; the held-out
evals are a phase of their own (`seconds_eval`) and are left out of `step_s`, as in the table.
`credit_over_sampling` is value estimation's share: the run's summed credit seconds over its
summed sampling seconds. Against the baseline: the ratios of median step seconds and of summed
step seconds. Runs that differ after step 1 draw different samples (the policies diverge), so a
ratio compares whole runs at one budget, not one batch under two methods.

Nothing is timed here: the seconds are what the runs wrote; whether the machine was quiet is the
caller's to say (docs/studies/real-model.md says it per figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rredcot_cli.store import metrics_log


def phases(run: Path) -> dict:
    """Median (steps 2..N) and sum of every `seconds*` column of RUN's metrics."""
    metrics = run / "train" / "metrics.parquet" if (run / "train").is_dir() else run / "metrics.parquet"
    if not metrics.exists():
        raise SystemExit(f"{run}: no train/metrics.parquet there; give a `rredcot train` run folder (run.dir)")
    rows = metrics_log.read(metrics).to_pylist()
    if len(rows) < 2:
        raise SystemExit(f"{metrics}: {len(rows)} step(s); need at least 2 to leave the warm-up step out")
    columns = [c for c in rows[0] if c == "seconds" or c.startswith("seconds_")]
    out = {"run": str(run), "steps": len(rows)}
    for column in columns:
        values = [r.get(column) or 0.0 for r in rows]
        name = "step" if column == "seconds" else column[len("seconds_"):]
        out[f"{name}_s_median"] = round(statistics.median(values[1:]), 3)
        out[f"{name}_s_sum"] = round(sum(values), 3)
    # `tokens` counts generated tokens since the run began (a resumed run's rows carry it on)
    out["generated_tokens"] = int(rows[-1]["tokens"])
    if out.get("sampling_s_sum"):
        out["sampling_tokens_per_s"] = round(out["generated_tokens"] / out["sampling_s_sum"], 1)
    if "credit_forward_tokens" in rows[0]:  # positions value estimation ran forward (None: no work)
        worked = [r for r in rows if r.get("credit_forward_tokens")]
        out["steps_with_credit_work"] = len(worked)
        out["credit_forward_positions"] = int(sum(r["credit_forward_tokens"] for r in worked))
        if out.get("credit_s_sum"):
            out["credit_positions_per_s"] = round(out["credit_forward_positions"] / out["credit_s_sum"], 1)
    if out.get("sampling_s_sum"):
        out["credit_over_sampling"] = round(out.get("credit_s_sum", 0.0) / out["sampling_s_sum"], 4)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="NAME=RUN_DIR, one per run")
    p.add_argument("--baseline", help="the NAME the others are divided by (default: the first)")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    named = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise SystemExit(f"{item!r}: give each run as NAME=RUN_DIR (e.g. grpo=runs/grpo)")
        named[name] = phases(Path(path))
    baseline = args.baseline or next(iter(named))
    if baseline not in named:
        raise SystemExit(f"--baseline {baseline!r} is not one of the runs ({', '.join(named)})")
    base = named[baseline]
    for result in named.values():
        result[f"step_s_median_over_{baseline}"] = round(result["step_s_median"] / base["step_s_median"], 3)
        result[f"step_s_sum_over_{baseline}"] = round(result["step_s_sum"] / base["step_s_sum"], 3)
    report = {"bench": "step_phases", "baseline": baseline, "runs": named}
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return report


if __name__ == "__main__":
    main()
