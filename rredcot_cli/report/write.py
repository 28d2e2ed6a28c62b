"""Writing a report: ``write_report(report, out_dir)`` writes ``report.md``, ``report.csv``,
``final_accuracy.png``, ``accuracy_vs_step.png`` and ``accuracy_by_length.png`` (plus
``credit_quality.csv`` when there are credit-quality results), each atomically.
"""

from __future__ import annotations

from pathlib import Path

from rredcot_cli.store import runs as run_files
from rredcot_cli.report.compare import Report
from rredcot_cli.report.markdown import render_credit_quality_csv, render_csv, render_markdown
from rredcot_cli.report.plots import plot_accuracy_by_length, plot_accuracy_vs_step, plot_final_accuracy


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Write every file of the report into ``out_dir`` (each atomically); returns their paths."""
    out_dir = Path(out_dir)
    written = [
        run_files.atomic_write_text(out_dir / "report.md", render_markdown(report)),
        run_files.atomic_write_text(out_dir / "report.csv", render_csv(report)),
        plot_final_accuracy(report.groups, out_dir / "final_accuracy.png"),
        plot_accuracy_vs_step(report.groups, out_dir / "accuracy_vs_step.png"),
        plot_accuracy_by_length(report.groups, out_dir / "accuracy_by_length.png"),
    ]
    quality_csv = out_dir / "credit_quality.csv"
    if report.credit_quality:
        written.append(run_files.atomic_write_text(quality_csv, render_credit_quality_csv(report)))
    elif quality_csv.exists():  # left by an earlier report over other runs
        quality_csv.unlink()
    return written
