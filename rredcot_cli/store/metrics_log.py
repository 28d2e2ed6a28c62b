"""``metrics.parquet`` of a running ``rredcot train``, rewritten after every step at a cost that
does not grow with the Python rows.

The file is the contract (live readers see every finished step, each version whole: an atomic
replace), so each step still writes all rows. What grew with the run was turning the whole history
of row dicts into Arrow again at every step (1.2 s at 50,000 steps on the 2-core test machine,
against 0.3 s for the Parquet write itself): here only the new rows are converted, and appended to
an Arrow table kept between steps (bench/long_runs.py measures both; results/long-runs/).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rredcot_cli.store import artifacts

KIND = "train_metrics"
# Chunks (one per step) are merged into one when there are this many: fewer, larger pieces to write.
_MAX_CHUNKS = 256


class MetricsLog:
    """Writes ``path`` from the run's history (a list of row dicts that only grows at its end)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._table: pa.Table | None = None
        self._last_step = None

    def write(self, history: list[dict]) -> Path:
        """Write every row of ``history``, converting only those not converted before (a history
        that is not the one seen so far, e.g. restored by a resume, is converted afresh)."""
        done = 0 if self._table is None else self._table.num_rows
        if done > len(history) or (done and history[done - 1].get("step") != self._last_step):
            self._table, done = None, 0
        if len(history) > done:
            part = artifacts.build_table(KIND, history[done:])
            self._table = part if self._table is None else pa.concat_tables([self._table, part])
            if self._table.num_columns and self._table.column(0).num_chunks >= _MAX_CHUNKS:
                self._table = self._table.combine_chunks()
            self._last_step = history[-1].get("step")
        table = self._table if self._table is not None else artifacts.build_table(KIND, [])
        return artifacts.write_artifact(KIND, {name: table.column(name) for name in table.column_names}, self.path)
