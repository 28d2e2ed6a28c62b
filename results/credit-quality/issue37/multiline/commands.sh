#!/usr/bin/env bash
# Issue 37 item 4 / issue 39 item 5: SmolLM2-135M-Instruct on a task with multi-line answers and
# headroom (benchmark=arith_multiline: Work, Check, the graded Answer: line, a free Note:), then
# RREDCoT's value estimators judged there against Monte Carlo beside the two controls.
# Run from the repository root. OMP_NUM_THREADS=1; the machine was busy (2 cores shared with 6-8
# other jobs, load average 15-22): every timing here is a busy one.
set -euo pipefail
export OMP_NUM_THREADS=1
model="model=smollm2-135m-instruct model.chat_template=false benchmark=arith_multiline sampling.max_new_tokens=96"

# The runs committed here (headroom/, judge-traces/) were sampled with a scratch copy of the preset
# (benchmark=arith_ml_d in their overrides.yaml) whose composed benchmark settings are identical to
# benchmark=arith_multiline's (checked: the benchmark sections of their config.yaml are equal).
# Format iterations before it (6 test prompts x 8 each, busy): Work/Answer/Note in one user turn:
# 0/32 in format; as ChatML few-shot turns with a decomposed working line: pass@1 0.09; direct working
# line: pass@1 0.42, 2.8 segments; plus an inverse check line: 0.21, 3.8 segments; plus a restating
# check line (the preset): below.

# --- headroom: the 39 test questions x 8 at the default temperature (1.0); 1393 s busy
R=runs/hr
rredcot sample run.dir=$R seed=0 $model sample.num_prompts=39 sampling.n=8
rredcot segment run.dir=$R seed=0 $model
python bench/headroom.py $R/sample/samples.parquet --segments $R/segment/segments.parquet \
  --out results/credit-quality/issue37/multiline/headroom.json

# --- the judge: its own traces (seed 1), 10 test prompts x 8, 5 batches of 2 groups, MC K = 8
# (sampling: 410 s busy; the MC reference ~15 min per batch busy)
R=runs/jd
rredcot sample run.dir=$R seed=1 $model sample.num_prompts=10 sampling.n=8
rredcot segment run.dir=$R seed=1 $model
python bench/headroom.py $R/sample/samples.parquet --segments $R/segment/segments.parquet \
  --out results/credit-quality/issue37/multiline/judge-traces.json
# One `rredcot judge judge.batches=5` on runs/jd would take ~15 min per batch here (busy), and it
# writes nothing until every batch is done; so the 5 batches (2 prompt groups each, in order, as
# judge.batches=5 cuts them) run as 5 judges side by side, each on a copy of its 2 groups (the
# manifests' sha256 updated). MC continuations depend only on (seed, prefix), so the reference
# values are those one judge would compute; bench/judge_compare.py numbers the batches on.
python - <<'PY'
import hashlib, json, os, shutil
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
s = pq.read_table("runs/jd/sample/samples.parquet"); g = pq.read_table("runs/jd/segment/segments.parquet")
prompts = list(dict.fromkeys(s.column("prompt_id").to_pylist()))
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
for b in range(5):
    d = f"runs/jd-b{b + 1}"; shutil.rmtree(d, ignore_errors=True)
    for stage, table, name in (("sample", s, "samples.parquet"), ("segment", g, "segments.parquet")):
        os.makedirs(f"{d}/{stage}")
        for f in ("config.yaml", "manifest.json", "overrides.yaml"):
            shutil.copy(f"runs/jd/{stage}/{f}", f"{d}/{stage}/{f}")
        pq.write_table(table.filter(pc.is_in(table.column("prompt_id"), value_set=pa.array(prompts[2 * b:2 * b + 2]))), f"{d}/{stage}/{name}")
    m = json.load(open(f"{d}/sample/manifest.json")); m["outputs"]["samples"]["sha256"] = sha(f"{d}/sample/samples.parquet")
    json.dump(m, open(f"{d}/sample/manifest.json", "w"), indent=2)
    m = json.load(open(f"{d}/segment/manifest.json")); m["inputs"]["samples"].update(path=f"{d}/sample/samples.parquet", sha256=sha(f"{d}/sample/samples.parquet"))
    m["outputs"]["segments"]["sha256"] = sha(f"{d}/segment/segments.parquet"); json.dump(m, open(f"{d}/segment/manifest.json", "w"), indent=2)
PY
for b in 1 2 3 4 5; do
  common="run.dir=runs/jd-b$b seed=1 $model judge.batches=1 judge.reference_k=8 judge.reruns=1"
  # the first computes the MC reference (kept in runs/jd-b$b/mc-reference/), the others reuse it
  ( rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=answer-probe   # the model's default: answer_probe
    rredcot judge $common 'judge.methods=[rredcot]' run.tag=suffix-is +judge.params.rredcot.value=suffix_is
    rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-share +judge.params.rredcot.value=answer_share ) &
done
wait
J=results/credit-quality/issue37/multiline
tables() { echo runs/jd-b{1..5}/judge-$1/credit_quality.parquet | tr ' ' ','; }
python bench/judge_compare.py answer_probe=$(tables answer-probe) suffix_is=$(tables suffix-is) \
  answer_share=$(tables answer-share) --out $J/judge_compare.json | tee $J/judge_table.md
