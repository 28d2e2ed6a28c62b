"""Cut a run's saved traces into the judge's batches and write each as its own samples/segments
pair, so each batch can be judged by its own `rredcot judge` (judge.batches=1):

    python scripts/judge_batches_apart.py RUN_DIR [BATCHES=5]
    rredcot judge run.dir=RUN_DIR/judge-b0 inputs.samples=RUN_DIR/batch0/samples.parquet \
        inputs.segments=RUN_DIR/batch0/segments.parquet judge.batches=1 ...

The cut is `rredcot judge`'s own (stages/judge.split_batches: contiguous runs of whole prompt
groups, split_evenly), and a trace's Monte Carlo reference depends on (seed, prefix) only, so a
batch judged alone gets the same reference values, and every method the same row, as that batch
in one judge of all the traces (checked on grpo's rows in docs/studies/credit-quality.md). Judged apart,
the batches can run one at a time on a busy machine and each finished one counts.
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rredcot_cli.train.distributed import split_evenly


def main(run: Path, batches: int) -> None:
    samples = pq.read_table(run / "sample/samples.parquet")
    segments = pq.read_table(run / "segment/segments.parquet")
    prompts = list(dict.fromkeys(samples.column("prompt_id").to_pylist()))
    for b, part in enumerate(split_evenly(prompts, batches)):
        out = run / f"batch{b}"
        out.mkdir(exist_ok=True)
        for table, name in ((samples, "samples.parquet"), (segments, "segments.parquet")):
            keep = pc.is_in(table.column("prompt_id"), value_set=pa.array(part))
            pq.write_table(table.filter(keep), out / name)
        print(f"batch {b}: {len(part)} prompts -> {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
