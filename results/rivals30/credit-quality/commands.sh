#!/usr/bin/env bash
# How results/rivals30/credit-quality was made (2026-12-04, one torch thread each, on the shared
# 2-core machine beside 3-6 training runs and other sessions' jobs; run dir was /tmp/hm/cq/run).
set -euo pipefail
export OMP_NUM_THREADS=1
RUN=runs/cq30
rredcot sample  run.dir=$RUN seed=0 sample.num_prompts=40 sampling.n=8
rredcot segment run.dir=$RUN seed=0
python scripts/judge_batches_apart.py $RUN 5
for b in 0 1 2 3 4; do
  rredcot judge run.dir=$RUN/judge-b$b seed=0 inputs.samples=$RUN/batch$b/samples.parquet \
      inputs.segments=$RUN/batch$b/segments.parquet judge.batches=1 judge.reference_k=16 judge.reruns=3 \
      'judge.methods=[grpo,high_entropy,grpo_vps]'
done
# the five judges' rows in one parquet, batch = k (each judge wrote batch 0)
python - <<'PY'
import pyarrow as pa, pyarrow.parquet as pq
tables = []
for k in range(5):
    t = pq.read_table(f"runs/cq30/judge-b{k}/judge/credit_quality.parquet")
    i = t.schema.get_field_index("batch")
    tables.append(t.set_column(i, "batch", pa.array([k] * t.num_rows, t.schema.field("batch").type)))
pq.write_table(pa.concat_tables(tables), "results/rivals30/credit-quality/credit_quality.parquet")
PY
python scripts/credit_quality_table.py results/credit-quality/r1/credit_quality.parquet \
    results/rivals30/credit-quality/credit_quality.parquet \
    '--label=results/rivals30/credit-quality/credit_quality.parquet=issue 30' \
    --pair 'high_entropy (issue 30)' grpo --pair 'grpo_vps (issue 30)' grpo --pair rredcot 'grpo_vps (issue 30)'
