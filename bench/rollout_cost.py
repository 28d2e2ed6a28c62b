"""What saving training rollouts costs (`train.save_rollouts`, docs/watching.md, "Watching a training run").

    python bench/rollout_cost.py                     # default config, 6 steps, every step saved
    python bench/rollout_cost.py --steps 10 -- method=grpo

Runs ``rredcot train`` in this process with ``train.save_rollouts=1`` and a timer around
``train_rollouts.save``, then reports per saved step the seconds spent writing it, its bytes on
disk, and the step's own seconds (``metrics.parquet``). Writes ``results/throughput/rollout_cost.json``.
A saved step at rate N costs (write seconds / step seconds) / N of the run time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import loadavg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "throughput" / "rollout_cost.json"))
    ap.add_argument("overrides", nargs="*", help="extra rredcot overrides")
    args = ap.parse_args()


    from rredcot_cli.store import metrics_log, train_rollouts
    from rredcot_cli.cli import app

    writes: dict[int, float] = {}
    save = train_rollouts.save

    def timed_save(train_dir, step, **kwargs):
        started = time.perf_counter()
        folder = save(train_dir, step, **kwargs)
        writes[step] = time.perf_counter() - started
        return folder

    train_rollouts.save = timed_save
    run = Path(tempfile.mkdtemp(prefix="rredcot-rollout-cost-")) / "run"
    command = ["train", f"run.dir={run}", "seed=0", f"train.steps={args.steps}", "train.save_rollouts=1",
               "train.eval_every=0", "train.save_every=0", *args.overrides]
    try:
        app(command, standalone_mode=False)
    finally:
        train_rollouts.save = save
    metrics = {row["step"]: row for row in metrics_log.read(run / "train" / "metrics.parquet").to_pylist()}
    rows = []
    for step, seconds in sorted(writes.items()):
        folder = train_rollouts.step_dir(run / "train", step)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        rows.append({"step": step, "write_seconds": seconds, "bytes": size, "step_seconds": metrics[step]["seconds"],
                     "generated_tokens": metrics[step]["response_tokens_mean"]})
    later = rows[1:] or rows  # step 1 also pays for first imports
    share = statistics.median(r["write_seconds"] / r["step_seconds"] for r in later)
    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python bench/rollout_cost.py " + " ".join([f"--steps {args.steps}", *args.overrides]),
        "rredcot_command": "rredcot " + " ".join(command),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "loadavg_end": loadavg()},
        "rows": rows,
        "median_write_seconds": statistics.median(r["write_seconds"] for r in later),
        "median_bytes": statistics.median(r["bytes"] for r in later),
        "median_step_seconds": statistics.median(r["step_seconds"] for r in later),
        "median_share_of_step_saving_every_step": share,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"write {result['median_write_seconds'] * 1000:.0f} ms, {result['median_bytes'] / 1000:.0f} KB per saved step; "
          f"step {result['median_step_seconds']:.2f} s; {share:.2%} of a step when every step is saved "
          f"({share / 5:.2%} at the default rate 5) -> {args.out}")


if __name__ == "__main__":
    main()
