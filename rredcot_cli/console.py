"""The terminal every stage and the train loop print to: one rich console on stderr (stdout stays
free for what a command outputs) and its progress bar."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int, transient: bool = False) -> Iterator[Any]:
    """A rich progress bar on stderr; yields ``advance(k, **fields)``."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=transient) as progress:
        task = progress.add_task(description, total=total, info="")

        def advance(k: int = 1, info: str | None = None) -> None:
            progress.update(task, advance=k, **({"info": info} if info is not None else {}))

        yield advance
