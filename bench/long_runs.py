"""Does a long ``rredcot train`` stay flat? Per step: the time spent writing the metrics (the
loop's ``Recorder.write``: metrics.parquet, trackers, saved rollouts), the process's resident memory, and the size of the
checkpoint's trainer state; then the least-squares slope of each against the step (issue 31).

Runs the CLI in this process with ``Recorder.write`` and ``checkpoint.save`` wrapped (timed;
nothing else changes), on the embedded model with tiny batches, and writes JSON to ``--out``
(default results/long-runs/):

    python bench/long_runs.py --steps 1000 --label after
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from measure import proc_status

REPO = Path(__file__).resolve().parents[1]
# One problem, two completions of at most 8 tokens: the loop's own bookkeeping is a large share.
SETTINGS = ["seed=0", "benchmark.min_steps=2", "benchmark.max_steps=2", "sampling.n=2", "sampling.max_new_tokens=8",
            "train.prompts_per_step=1", "train.minibatch_size=2", "train.updates_per_batch=1", "train.eval_every=0",
            "train.eval_problems=1", "train.eval_samples=1", "train.save_every=100", "train.keep_checkpoints=1"]


def rss_mb() -> float:
    return proc_status("VmRSS") / 2**20


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "long-runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    # the checkpoint writer and the loop's per-step recorder are timed where they run: no public
    # seam times a write inside a run
    from rredcot_cli.train import checkpoint

    per_step: dict[int, dict] = {}
    checkpoints: list[dict] = []
    real_save = checkpoint.save

    def timed_save(path, state, parts, config_hash):
        began = time.perf_counter()
        real_save(path, state, parts, config_hash)
        size = (Path(path) / checkpoint.STATE_FILE).stat().st_size if (Path(path) / checkpoint.STATE_FILE).exists() else None
        checkpoints.append({"step": state.step, "seconds": time.perf_counter() - began, "trainer_state_bytes": size})

    import rredcot_cli.train.loop as loop

    real_record = loop.Recorder.write

    def timed_record(self, step, result):  # the loop's per-step writes (metrics, trackers, rollouts)
        began = time.perf_counter()
        real_record(self, step, result)
        per_step[step] = {"step": step, "write_seconds": time.perf_counter() - began, "rss_mb": rss_mb(),
                          "history_rows": self.metrics.rows}

    loop.Recorder.write = timed_record
    checkpoint.save = loop.checkpoint.save = timed_save

    from rredcot_cli.cli import app

    run = Path(tempfile.mkdtemp(prefix="long-run-"))
    began = time.perf_counter()
    sys.argv = ["rredcot", "train", f"run.dir={run}", f"train.steps={args.steps}", *SETTINGS, *args.overrides]
    try:
        app()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    seconds = time.perf_counter() - began
    rows = [per_step[s] for s in sorted(k for k in per_step if k)]
    steps = [r["step"] for r in rows]
    tail = [r for r in rows if r["step"] > len(rows) // 10]  # past the start-up
    report = {
        "study": "long-runs", "label": args.label, "steps": args.steps, "settings": SETTINGS + args.overrides,
        "seconds": round(seconds, 1),
        "metrics_write_seconds_per_step_slope": slope([r["step"] for r in tail], [r["write_seconds"] for r in tail]),
        "metrics_write_seconds_first_100_mean": sum(r["write_seconds"] for r in rows[:100]) / max(1, len(rows[:100])),
        "metrics_write_seconds_last_100_mean": sum(r["write_seconds"] for r in rows[-100:]) / max(1, len(rows[-100:])),
        "rss_mb_per_step_slope": slope([r["step"] for r in tail], [r["rss_mb"] for r in tail]),
        "trainer_state_bytes_per_step_slope": slope([c["step"] for c in checkpoints],
                                                    [c["trainer_state_bytes"] for c in checkpoints]),
        "rss_mb_at_10pct": tail[0]["rss_mb"] if tail else None, "rss_mb_at_end": rows[-1]["rss_mb"] if rows else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "metrics_file_bytes": sum(p.stat().st_size for p in (run / "train" / "metrics.parquet").rglob("*.parquet")),
        "checkpoints": checkpoints, "per_step": rows, "machine": platform.platform(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "written_steps": len(steps),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.label}-{args.steps}-steps.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("per_step", "checkpoints", "settings")}, indent=1))
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
