"""`rredcot report RUN_DIR... [--out DIR]`: finished training runs side by side.

Unlike the other stages it takes run dirs, not a config: it reads each ``<run>/train/`` (see
``rredcot_cli.report.load``), groups and aggregates them (``rredcot_cli.report.compare``) and writes
``report.md``, ``report.csv``, ``accuracy_vs_step.png`` and ``accuracy_by_length.png`` into ``out``
(default ``runs/report``; ``rredcot_cli.report.write``), rewritten atomically on every call under the
folder's writer lock (``store/lock.py``: a second report into it is refused in one line), then
prints the main table. A run dir without a finished train stage, or runs on different benchmarks,
stop it with one line (``RunError``); with ``--skip-unfinished`` unfinished run dirs are left out
and named instead (a sweep still running, or cells that failed). A paired comparison whose arms ran
on different or unknown commits (the manifests' git sha) is left out of the paired section, with a
warning line per group, unless ``--allow-mixed-commits`` keeps it, flagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from rredcot_cli.console import make_console, print_table
from rredcot_cli.report.compare import build_report
from rredcot_cli.report.markdown import mixed_commits_line, summary_rows
from rredcot_cli.report.write import write_report
from rredcot_cli.store import lock

DEFAULT_OUT = Path("runs/report")


def run(run_dirs: Sequence[str | Path], out: str | Path = DEFAULT_OUT, skip_unfinished: bool = False,
        baseline: str | None = None, allow_mixed_commits: bool = False) -> list[Path]:
    """Build the report over ``run_dirs``, write it into ``out`` and print its table; returns the files.

    ``skip_unfinished``: leave out run dirs whose train stage did not finish (named in one line on
    stderr and at the end of report.md) instead of failing. ``baseline``: the group the paired
    section compares against (default ``grpo`` when present). ``allow_mixed_commits``: keep paired
    comparisons across commits in the paired section, flagged, instead of leaving them out."""
    report = build_report(run_dirs, skip_unfinished=skip_unfinished, baseline=baseline,
                          allow_mixed_commits=allow_mixed_commits)
    stderr = Console(stderr=True, soft_wrap=True)
    if report.skipped:
        stderr.print(f"skipping {len(report.skipped)} unfinished run dir(s) (train did not finish): "
                     f"{', '.join(map(str, report.skipped))}", markup=False, highlight=False)
    for row in report.paired + report.refused:
        if row.cross_commit:
            stderr.print(f"warning: {mixed_commits_line(row, report.baseline, refused=not allow_mixed_commits)}",
                         markup=False, highlight=False)
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
    console = make_console(stderr=False)
    print_table(table, console)
    console.print("± : 95% Student-t interval over seeds (none with one seed)")
    for path in written:
        print(path)
    return written
