#!/usr/bin/env bash
# Batches 1-5 of issue 37's multiline-15 judge, answer_probe only, at this commit (after the packed
# probe scorer of ea55fc9), against the committed tables judged before it (93332a1, 1b3c0b5, 498b0a3):
# the same samples byte for byte (seed 1) and the kept MC references, so only the scorer differs.
set -euo pipefail
# run from the repository root, with the venv active (rredcot on PATH)
export OMP_NUM_THREADS=1
model="model=smollm2-135m-instruct model.chat_template=false benchmark=arith_multiline sampling.max_new_tokens=96"
J=results/credit-quality/issue37/multiline-15
R=runs/rejudge
rredcot sample run.dir=$R/jd seed=1 $model sample.num_prompts=10 sampling.n=8
rredcot segment run.dir=$R/jd seed=1 $model
python - $R/jd $R/jd-b 5 <<'PY'
import hashlib, json, os, shutil, sys
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
src, prefix, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = pq.read_table(f"{src}/sample/samples.parquet"); g = pq.read_table(f"{src}/segment/segments.parquet")
prompts = list(dict.fromkeys(s.column("prompt_id").to_pylist()))
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
for b in range(batches):
    d = f"{prefix}{b + 1}"; shutil.rmtree(d, ignore_errors=True)
    for stage, table, name in (("sample", s, "samples.parquet"), ("segment", g, "segments.parquet")):
        os.makedirs(f"{d}/{stage}")
        for f in ("config.yaml", "manifest.json", "overrides.yaml"):
            shutil.copy(f"{src}/{stage}/{f}", f"{d}/{stage}/{f}")
        pq.write_table(table.filter(pc.is_in(table.column("prompt_id"), value_set=pa.array(prompts[2 * b:2 * b + 2]))), f"{d}/{stage}/{name}")
    m = json.load(open(f"{d}/sample/manifest.json")); m["outputs"]["samples"]["sha256"] = sha(f"{d}/sample/samples.parquet")
    json.dump(m, open(f"{d}/sample/manifest.json", "w"), indent=2)
    m = json.load(open(f"{d}/segment/manifest.json")); m["inputs"]["samples"].update(path=f"{d}/sample/samples.parquet", sha256=sha(f"{d}/sample/samples.parquet"))
    m["outputs"]["segments"]["sha256"] = sha(f"{d}/segment/segments.parquet"); json.dump(m, open(f"{d}/segment/manifest.json", "w"), indent=2)
    print(d, sha(f"{d}/sample/samples.parquet"), sha(f"{d}/segment/segments.parquet"))
PY
for b in 1 2 3 4 5; do
  mkdir -p $R/jd-b$b/mc-reference
  cp $J/judge/b$b/mc-reference/* $R/jd-b$b/mc-reference/
  rredcot judge run.dir=$R/jd-b$b seed=1 $model judge.batches=1 judge.reference_k=8 judge.reruns=1 \
    'judge.methods=[grpo,rredcot]' run.tag=answer-probe
done
O=$J/rejudge-packed
for b in 1 2 3 4 5; do mkdir -p $O/b$b && cp -r $R/jd-b$b/judge-answer-probe $O/b$b/; done
python $O/compare.py > $O/compare.json
