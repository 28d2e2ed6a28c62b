"""The terminal every stage and the train loop print to: one rich console on stderr (stdout stays
free for what a command outputs), its progress display and its tables.

Outside a terminal (``> log 2>&1``, nohup, a Slurm log) there is no live bar to redraw: the
progress display prints a plain line per finished step instead, and lines and tables get a wide
fixed width, so nothing is cut or wrapped at rich's default of 80 columns."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

# Columns of a log file: wide enough for the widest table (judge's ten columns) on one line.
LOG_WIDTH = 200


def make_console(stderr: bool = True) -> Console:
    """A console on stderr (or stdout); when that stream is not a terminal, LOG_WIDTH columns and
    text lines that are never wrapped (a log is read with a pager or grep, not at 80 columns)."""
    terminal = Console(stderr=stderr)
    return terminal if terminal.is_terminal else Console(stderr=stderr, width=LOG_WIDTH, soft_wrap=True)


console = make_console()


def print_table(table: Table, out: Console | None = None) -> None:
    """Print ``table`` with its title whole: rich wraps a title to the table's width, which broke a
    long title over a narrow table into pieces."""
    if isinstance(table.title, str):
        table.min_width = max(table.min_width or 0, cell_len(table.title))
    (out or console).print(table)


@contextmanager
def progress_bar(description: str, total: int, transient: bool = False, unit: str = "") -> Iterator[Any]:
    """Progress on stderr; yields ``advance(k, info=None)``. In a terminal a rich bar; otherwise plain
    lines (``plain_progress``). ``unit`` names what is counted in those lines (e.g. "step")."""
    if not console.is_terminal:
        yield plain_progress(description, total, unit)
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=transient) as progress:
        task = progress.add_task(description, total=total, info="")

        def advance(k: int = 1, info: str | None = None) -> None:
            progress.update(task, advance=k, **({"info": info} if info is not None else {}))

        yield advance


def plain_progress(description: str, total: int, unit: str = "") -> Callable[..., None]:
    """``advance(k, info=None)`` for a log: one line per call that brings ``info`` (a train step's
    reward and loss, an eval's score), otherwise one per tenth of ``total`` and one at the end, e.g.
    ``train grpo  step 3/20  reward 0.41  acc 0.40  kl 0.0012  loss 0.012  430 tok/s  12.3 s``."""
    started = time.perf_counter()
    done, tenths = 0, 0
    counted = f"{unit} " if unit else ""

    def advance(k: int = 1, info: str | None = None) -> None:
        nonlocal done, tenths
        done += k
        reached = done * 10 // total if total > 0 else 10
        if info is None and reached == tenths and done != total:
            return
        tenths = reached
        fields = [description, f"{counted}{done}/{total}", *([info] if info else []),
                  f"{time.perf_counter() - started:.1f} s"]
        console.print("  ".join(fields), markup=False, highlight=False)

    return advance
