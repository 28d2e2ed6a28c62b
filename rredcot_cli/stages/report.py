"""`rredcot report RUN_DIR... [--out DIR]`: finished training runs side by side.

Unlike the other stages it takes run dirs, not a config: it reads each ``<run>/train/`` (see
``rredcot_cli.report.load``), groups and aggregates them (``rredcot_cli.report.compare``) and writes
``report.md``, ``report.csv``, ``accuracy_vs_step.png`` and ``accuracy_by_length.png`` into ``out``
(default ``runs/report``; ``rredcot_cli.report.write``), rewritten atomically on every call under the
folder's writer lock (``store/lock.py``: a second report into it is refused in one line), then
prints the main table. A run dir without a finished train stage, or runs on different benchmarks,
stop it with one line (``RunError``); with ``--skip-unfinished`` unfinished run dirs are left out
and named instead (a sweep still running, or cells that failed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from rredcot_cli.report.compare import build_report
from rredcot_cli.report.markdown import summary_rows
from rredcot_cli.report.write import write_report
from rredcot_cli.store import lock

DEFAULT_OUT = Path("runs/report")


def run(run_dirs: Sequence[str | Path], out: str | Path = DEFAULT_OUT, skip_unfinished: bool = False,
        baseline: str | None = None) -> list[Path]:
    """Build the report over ``run_dirs``, write it into ``out`` and print its table; returns the files.

    ``skip_unfinished``: leave out run dirs whose train stage did not finish (named in one line on
    stderr and at the end of report.md) instead of failing. ``baseline``: the group the paired
    section compares against (default ``grpo`` when present)."""
    report = build_report(run_dirs, skip_unfinished=skip_unfinished, baseline=baseline)
    if report.skipped:
        Console(stderr=True, soft_wrap=True).print(
            f"skipping {len(report.skipped)} unfinished run dir(s) (train did not finish): "
            f"{', '.join(map(str, report.skipped))}", markup=False, highlight=False)
    # one writer per folder, as every stage: two reports into one folder would mix their files
    lock.lock_output_folder(out, beside="pass --out DIR")
    written = write_report(report, out)
    header, rows = summary_rows(report)
    table = Table(title=f"rredcot report · {report.benchmark.get('name')} · {len(report.runs)} runs",
                  show_header=True, header_style="bold")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print("± : 95% Student-t interval over seeds (none with one seed)")
    for path in written:
        print(path)
    return written
