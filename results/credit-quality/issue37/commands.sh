#!/usr/bin/env bash
# Issue 37: RREDCoT's value estimators against Monte Carlo and the two controls, before and after
# the leave-one-out fix. Run from the repository root; every judge here reuses the kept MC reference
# (mc-reference/), so it takes seconds to minutes. "before" is the code at 9706c73 (a worktree of it,
# same commands). OMP_NUM_THREADS=1; the machine was busy (2 cores shared with 6-8 other jobs).
set -euo pipefail
export OMP_NUM_THREADS=1

# --- SmolLM2-135M-Instruct on arith: the committed judge traces of results/real-model/judge/
R=runs/rmj
mkdir -p $R && cp -r results/real-model/judge/{sample,segment,mc-reference} $R/
common="run.dir=$R seed=0 judge.batches=5 judge.reference_k=8 judge.reruns=1 model=smollm2-135m-instruct benchmark=arith sampling.max_new_tokens=48"
rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=immediate              # the default: answer_probe, immediate
rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=is-plain +judge.params.rredcot.value=suffix_is
rredcot judge $common 'judge.methods=[rredcot]' run.tag=is-sn +judge.params.rredcot.value=suffix_is +judge.params.rredcot.is_self_normalised=true
rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-share +judge.params.rredcot.value=answer_share
rredcot judge $common 'judge.methods=[rredcot]' run.tag=rtg +judge.params.rredcot.advantage=reward_to_go
rredcot judge $common 'judge.methods=[rredcot]' run.tag=mixed +judge.params.rredcot.advantage=mixed
# the per-completion values, then the shares and agreement beside the controls
common="run.dir=$R seed=0 model=smollm2-135m-instruct benchmark=arith sampling.max_new_tokens=48 method=rredcot"
for v in suffix_is answer_probe answer_share; do rredcot attribute $common run.tag=$v method.value=$v; done
# (before: `rredcot attribute $common` at 9706c73 wrote attribute-before/)
python bench/value_vs_outcome.py $R/sample/samples.parquet before=$R/attribute-before/rredcot/credits.parquet \
  suffix_is=$R/attribute-suffix_is/rredcot/credits.parquet answer_probe=$R/attribute-answer_probe/rredcot/credits.parquet \
  answer_share=$R/attribute-answer_share/rredcot/credits.parquet --reference $R/mc-reference/f02a8dd09ef3.parquet \
  --out results/credit-quality/issue37/real-model/value_vs_outcome.json

# --- the embedded model, R1 (chain, 4-12 steps): 40 prompts x 8, K = 16
R=runs/cq-r1
rredcot sample run.dir=$R seed=0 sample.num_prompts=40 sampling.n=8
rredcot segment run.dir=$R seed=0
common="run.dir=$R seed=0 judge.batches=5 judge.reference_k=16 judge.reruns=1"
rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=immediate              # the default: suffix_is, ordinary IS
rredcot judge $common 'judge.methods=[rredcot]' run.tag=is-sn +judge.params.rredcot.is_self_normalised=true
rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-probe +judge.params.rredcot.value=answer_probe
rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-share +judge.params.rredcot.value=answer_share
rredcot judge $common 'judge.methods=[rredcot]' run.tag=rtg +judge.params.rredcot.advantage=reward_to_go
rredcot judge $common 'judge.methods=[rredcot]' run.tag=mixed +judge.params.rredcot.advantage=mixed
rredcot attribute run.dir=$R seed=0 method=rredcot run.tag=now
python bench/value_vs_outcome.py $R/sample/samples.parquet before=$R/attribute-before/rredcot/credits.parquet \
  after=$R/attribute-now/rredcot/credits.parquet --reference $R/mc-reference/cc8436799efd.parquet \
  --out results/credit-quality/issue37/r1/value_vs_outcome.json

# --- the embedded model at 14-20 steps (chain, ~110 tokens, ~17.6 newline segments): 10 prompts x 8, K = 8
R=runs/cq-c1420
ex="benchmark.min_steps=14 benchmark.max_steps=20 sampling.max_new_tokens=224"
rredcot sample run.dir=$R seed=0 sample.num_prompts=10 sampling.n=8 $ex
rredcot segment run.dir=$R seed=0 $ex
common="run.dir=$R seed=0 $ex judge.batches=5 judge.reference_k=8 judge.reruns=1"
rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=immediate
rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-probe +judge.params.rredcot.value=answer_probe
rredcot attribute run.dir=$R seed=0 $ex method=rredcot run.tag=now
python bench/value_vs_outcome.py $R/sample/samples.parquet before=$R/attribute-before/rredcot/credits.parquet \
  after=$R/attribute-now/rredcot/credits.parquet --reference $R/mc-reference/*.parquet \
  --out results/credit-quality/issue37/chain14-20/value_vs_outcome.json

# --- after 1d99ebb (a mate's suffix cut from the very state of the prefix weighs exactly 1): the
# defaults rejudged on the same traces (R1's default row in docs/studies/credit-quality.md is this one)
rredcot judge run.dir=runs/cq-r1 seed=0 judge.batches=5 judge.reference_k=16 judge.reruns=1 'judge.methods=[grpo,rredcot]' run.tag=default
rredcot judge run.dir=runs/cq-c1420 seed=0 benchmark.min_steps=14 benchmark.max_steps=20 sampling.max_new_tokens=224 \
  judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[grpo,rredcot]' run.tag=default
