"""One step's metrics.parquet write at a given history size, the old way (all row dicts converted
again, ``artifacts.write_artifact``) and the current one (``store.metrics_log.MetricsLog``: the new
row converted, only the last part file of the folder written) and a resume's read of the rows back; the memory the rows take as the Python dicts the loop
kept before and as the Arrow table ``MetricsLog`` keeps now (the last part's rows), and the bytes the dicts added to every
checkpoint's trainer_state.pt before (pickled by torch.save; checkpoints hold no rows now). For what
a run of 100,000 steps costs, measured rather than extrapolated (issue 31; results/long-runs/).

    python bench/metrics_write_at_size.py --rows 1000 10000 100000
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def metrics_row(step: int) -> dict:
    """A row with every metrics column (values of a real step's magnitude)."""
    from rredcot_cli.store import artifacts

    row = {}
    for field in artifacts.get_spec("train_metrics").schema:
        row[field.name] = 0.1234567 * (step % 97 + 1) if str(field.type).startswith(("float", "double")) else step
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "long-runs")
    args = parser.parse_args()
    import torch

    from rredcot_cli.store import artifacts
    from rredcot_cli.store.metrics_log import MetricsLog

    folder = Path(tempfile.mkdtemp(prefix="metrics-size-"))
    sizes = []
    for n in args.rows:
        tracemalloc.start()
        history = [metrics_row(i + 1) for i in range(n)]
        history_mb = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        began = time.perf_counter()
        artifacts.write_artifact("train_metrics", history, folder / "old.parquet")
        old = time.perf_counter() - began
        log = MetricsLog(folder / "new.parquet")
        log.restore(n - 1, history[:-1])  # the run so far
        log.write()  # a resume's first write puts the whole folder in place
        began = time.perf_counter()
        log.append(history[-1])  # this step
        log.write()
        new = time.perf_counter() - began
        began = time.perf_counter()
        MetricsLog(folder / "new.parquet").restore(n)  # what a resume from step n reads back
        restore = time.perf_counter() - began
        pickled = io.BytesIO()
        torch.save({"progress": {"history": history}}, pickled)
        sizes.append({"rows": n, "old_write_seconds": round(old, 4), "new_write_seconds": round(new, 4),
                      "resume_read_seconds": round(restore, 4),
                      "history_dicts_mb": round(history_mb, 1), "metrics_table_mb": round(log.part.nbytes / 2**20, 1),
                      "history_in_trainer_state_mb": round(pickled.tell() / 2**20, 1),
                      "file_mb": round(sum(p.stat().st_size for p in (folder / "new.parquet").rglob("*.parquet")) / 2**20, 2)})
        print(json.dumps(sizes[-1]), flush=True)
    report = {"study": "long-runs", "what": "one step's metrics write at a history size", "sizes": sizes,
              "columns": len(metrics_row(1)), "machine": platform.platform(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "write-at-size.json").write_text(json.dumps(report, indent=1) + "\n")
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
