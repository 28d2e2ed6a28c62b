"""``metrics.parquet`` of a running ``rredcot train``: the one owner of the run's metrics rows,
kept as one Arrow table and rewritten after every step at a cost that does not grow with Python
objects.

The file is the contract (live readers see every finished step, each version whole: an atomic
replace), so each step still writes all rows. What grew with the run was (1) turning the whole
history of row dicts into Arrow again at every step (8.2 s a step at 100,000 steps on the busy
2-core test machine), (2) keeping those dicts in memory (about 3.5 kB a step) and (3) pickling
them into every checkpoint's ``trainer_state.pt`` (about 1 kB a step). Here each row is converted
once, appended to a columnar table (about 0.2 kB a step) and written as it is; a checkpoint holds
no rows: a resume reads them back from this file (``restore``), which the loop writes after every
step and before that step's checkpoint, so it always holds the checkpoint's steps (bench/long_runs.py,
results/long-runs/).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rredcot_cli.errors import ArtifactError
from rredcot_cli.store import artifacts

KIND = "train_metrics"


class MetricsLog:
    """The metrics rows of a run (one per finished step, in order) and ``path``, the file they are
    written to."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.table = artifacts.build_table(KIND, [])

    def append(self, row: dict) -> None:
        """Add one step's row (converted once, to the schema's types)."""
        part = artifacts.build_table(KIND, [row])
        # one chunk per column: a copy of the numbers (about 1 ms at 20,000 rows), cheaper to write
        # than thousands of one-row chunks
        self.table = pa.concat_tables([self.table, part]).combine_chunks()

    def write(self) -> Path:
        """Write every row so far to ``path``, atomically."""
        return artifacts.write_table(KIND, self.table, self.path)

    def restore(self, step: int, saved_rows: list[dict] | None = None) -> None:
        """The rows of steps 1..``step``, where a resumed run continues: ``saved_rows`` (what
        checkpoints carried before rows lived only here) when given, else read back from ``path``.
        Rows past ``step`` are dropped: the attempt that was stopped wrote them after its last
        checkpoint, and the resumed run makes them again."""
        fix = "restore the file of that run, or start over without train.resume=true"
        if saved_rows is not None:
            table = artifacts.build_table(KIND, saved_rows)
        elif not self.path.is_file():
            raise ArtifactError(f"{self.path} is missing, and the checkpoint resumed from (step {step}) holds no "
                                f"metrics rows; {fix}")
        else:
            read = artifacts.read_artifact(KIND, self.path)
            table = artifacts.build_table(KIND, {name: read.column(name) for name in self.table.schema.names})
        steps = table.column("step").to_pylist()[:step]
        if steps != list(range(1, step + 1)):
            held = f"steps {steps[0]}..{steps[-1]} ({len(steps)} rows)" if steps else "no step"
            raise ArtifactError(f"{self.path} holds the metrics of {held}, but the checkpoint resumed from is at "
                                f"step {step}; {fix}")
        self.table = table.slice(0, step).combine_chunks()
