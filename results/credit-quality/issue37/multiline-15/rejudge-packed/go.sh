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
python $J/split_batches.py $R/jd $R/jd-b 5
for b in 1 2 3 4 5; do
  mkdir -p $R/jd-b$b/mc-reference
  cp $J/judge/b$b/mc-reference/* $R/jd-b$b/mc-reference/
  rredcot judge run.dir=$R/jd-b$b seed=1 $model judge.batches=1 judge.reference_k=8 judge.reruns=1 \
    'judge.methods=[grpo,rredcot]' run.tag=answer-probe
done
O=$J/rejudge-packed
for b in 1 2 3 4 5; do mkdir -p $O/b$b && cp -r $R/jd-b$b/judge-answer-probe $O/b$b/ && rm -f $O/b$b/judge-answer-probe/.rredcot.lock; done
python $O/compare.py > $O/compare.json
