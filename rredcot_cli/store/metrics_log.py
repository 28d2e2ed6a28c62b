"""``metrics.parquet`` of a running ``rredcot train``: the one owner of the run's metrics rows, and
``read``, the one way to read them back (every reader: the train stage's summary, ``rredcot report``,
the benches).

The contract: a live reader sees every finished step, each version whole. Rewriting one file with
every row after every step kept it, at a cost that grew with the run (about 47 ms a step on average
over 100,000 steps, 1.3 h in all). So ``metrics.parquet`` is a folder of part files of
``ROWS_PER_PART`` rows each (``part-000000.parquet``, ``part-000001.parquet``, ...: one Parquet
dataset, which ``pyarrow.parquet.read_table`` and pandas read as one table too). After a step only
the last part is rewritten, atomically (its temporary a dot file, which dataset readers skip); a
full part is never written again. A step's write is at most ``ROWS_PER_PART`` rows, whatever the
run's length. Runs written before hold one ``metrics.parquet`` file; ``read`` reads both.

The first write of a run (or of a resumed run) replaces the whole folder at once: it may hold an
earlier attempt's rows, or be that older single file. A checkpoint holds no rows: a resume reads
them back from here (``restore``), which the loop writes after every step and before that step's
checkpoint, so it always holds the checkpoint's steps (bench/long_runs.py, results/long-runs/).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rredcot_cli.errors import ArtifactError
from rredcot_cli.store import artifacts
from rredcot_cli.store.atomic import atomic_path

KIND = "train_metrics"
# Rows per part file: a step writes at most this many rows (about 40 kB, as a 1,000-step run's whole
# file did), and a 100,000-step run has 100 parts to read.
ROWS_PER_PART = 1000


def read(path: str | Path) -> pa.Table:
    """Every finished step's row in ``path`` (a run's ``train/metrics.parquet``, the folder of parts
    or an older run's single file), checked against the schema; ``ArtifactError`` in one line."""
    return artifacts.read_artifact(KIND, path)


class MetricsLog:
    """The metrics rows of a run (one per finished step, in order) and ``path``, the folder they are
    written to: ``sealed`` full parts on disk, and ``part``, the rows of the part after them."""

    def __init__(self, path: str | Path, rows_per_part: int | None = None) -> None:
        self.path = Path(path)
        self.rows_per_part = rows_per_part or ROWS_PER_PART
        self.sealed = 0
        self.part = artifacts.build_table(KIND, [])
        # the rows of the sealed parts, held only until the first write puts the folder in place
        self._unwritten_sealed: pa.Table | None = self.part

    @property
    def rows(self) -> int:
        """Rows so far (steps finished)."""
        return self.sealed * self.rows_per_part + self.part.num_rows

    def append(self, row: dict) -> None:
        """Add one step's row (converted once, to the schema's types)."""
        # one chunk per column: cheaper to write than hundreds of one-row chunks
        self.part = pa.concat_tables([self.part, artifacts.build_table(KIND, [row])]).combine_chunks()

    def write(self) -> Path:
        """Write the rows so far to ``path``: the last part only, or the whole folder on the first write."""
        if self._unwritten_sealed is not None:
            self._write_folder(self._unwritten_sealed)
            self._unwritten_sealed = None
        elif self.part.num_rows:
            artifacts.write_table(KIND, self.part, self.path / artifacts.part_name(self.sealed), hidden=True)
        if self.part.num_rows >= self.rows_per_part:  # full: never written again; the next row starts a part
            self.sealed += 1
            self.part = self.part.slice(0, 0)
        return self.path

    def _write_folder(self, sealed_rows: pa.Table) -> None:
        """The folder with ``sealed_rows`` and ``part``, in place of what ``path`` held, atomically."""
        parts = [sealed_rows.slice(start, self.rows_per_part)
                 for start in range(0, sealed_rows.num_rows, self.rows_per_part)]
        parts += [self.part] if self.part.num_rows else []
        with atomic_path(self.path, needed=sum(part.nbytes for part in parts)) as folder:
            folder.mkdir()
            for index, part in enumerate(parts):
                artifacts.write_table(KIND, part, folder / artifacts.part_name(index))

    def restore(self, step: int, saved_rows: list[dict] | None = None) -> None:
        """The rows of steps 1..``step``, where a resumed run continues: ``saved_rows`` (what
        checkpoints carried before rows lived only here) when given, else read back from ``path``.
        Rows past ``step`` are dropped (from the folder at the next write): the attempt that was
        stopped wrote them after its last checkpoint, and the resumed run makes them again."""
        fix = "restore the file of that run, or start over without train.resume=true"
        if saved_rows is not None:
            table = artifacts.build_table(KIND, saved_rows)
        elif not self.path.exists():
            raise ArtifactError(f"{self.path} is missing, and the checkpoint resumed from (step {step}) holds no "
                                f"metrics rows; {fix}")
        else:
            found = read(self.path)
            table = artifacts.build_table(KIND, {name: found.column(name) for name in self.part.schema.names})
        steps = table.column("step").to_pylist()[:step]
        if steps != list(range(1, step + 1)):
            held = f"steps {steps[0]}..{steps[-1]} ({len(steps)} rows)" if steps else "no step"
            raise ArtifactError(f"{self.path} holds the metrics of {held}, but the checkpoint resumed from is at "
                                f"step {step}; {fix}")
        self.sealed = step // self.rows_per_part
        sealed_end = self.sealed * self.rows_per_part
        self._unwritten_sealed = table.slice(0, sealed_end).combine_chunks()
        self.part = table.slice(sealed_end, step - sealed_end).combine_chunks()
