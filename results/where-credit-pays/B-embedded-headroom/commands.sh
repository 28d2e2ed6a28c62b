#!/usr/bin/env bash
# Setting B-embedded of docs/where-credit-pays.md (issue 39, item 5, embedded half): the warm-up that
# makes model=tiny-chain-tail, its headroom check, the judge on its traces (does redistribution have
# something to find?), and the 3-step timing runs behind the proposed CPU budget. Run from the
# repository root; OMP_NUM_THREADS=1; the machine was busy (2 cores shared with about six other
# sessions, load average 14-21) for every number here. Outputs: this folder (small files only).
set -euo pipefail
export OMP_NUM_THREADS=1
D=results/where-credit-pays/B-embedded-headroom

# --- 1. the SFT warm-up: two rounds from the shipped tiny-chain (commit 5d08d6e, chain_tail before the rebase onto main, as 5b616aa; the result is
# rredcot_cli/assets/tiny-chain-tail, sha256 d9e2103f... of model.safetensors; its README and training.json)
rredcot sft run.dir=runs/tct1 seed=0 benchmark=chain_tail sft.init=tiny-chain sft.min_steps=2 sft.max_steps=12 \
  sft.solution_error_rate=0.08 sft.mix_benchmark=chain sft.mix_fraction=0.25 sft.steps=200 sft.batch_size=8 \
  sft.lr=2e-4 sft.warmup_steps=20
rredcot sft run.dir=runs/tct2 seed=1 benchmark=chain_tail benchmark.data_seed=1240 sft.init=runs/tct1/sft/model \
  sft.min_steps=2 sft.max_steps=12 sft.solution_error_rate=0.08 sft.mix_benchmark=chain sft.mix_fraction=0.25 \
  sft.steps=200 sft.batch_size=16 sft.lr=3e-4 sft.warmup_steps=10
# (sft-round1/, sft-round2/: their manifests, with the loss curves; they ran with run.dir=/tmp/ct/sft-b, /tmp/ct/sft-c)

# --- 2. headroom: 64 test problems (8-12 steps, chain_tail.yaml) x 8 samples at T=1, and greedy.
# (The committed evals ran with model.path=<round 2's folder>, whose weights are the asset's, byte for byte.)
ex="model=tiny-chain-tail benchmark=chain_tail sampling.max_new_tokens=224 seed=0"
rredcot eval run.dir=runs/tct-headroom-sampled $ex eval.num_problems=64 eval.n=8 'eval.k=[1,8]'
rredcot eval run.dir=runs/tct-headroom-greedy $ex eval.num_problems=64 eval.n=1 'eval.k=[1]' eval.temperature=0
python bench/headroom.py runs/tct-headroom-sampled/eval/eval.parquet --out $D/headroom-sampled/headroom.json
python bench/headroom.py runs/tct-headroom-greedy/eval/eval.parquet --out $D/headroom-greedy/headroom.json

# --- 3. the judge: 5 test prompts x 8 samples (one prompt group per batch), newline segments, MC reference K = 8, 5 batches;
# GRPO and RREDCoT (the registered arm's estimator: suffix_is, ordinary IS, immediate) beside the
# controls, then each method's credits and token advantages, and how much of them sits on the tail
R=runs/b-embedded-headroom
rredcot sample run.dir=$R $ex sample.num_prompts=5 sampling.n=8
rredcot segment run.dir=$R $ex
rredcot judge run.dir=$R $ex judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[grpo,rredcot]' run.tag=immediate
rredcot attribute run.dir=$R $ex method=grpo method.scale_by_std=true run.tag=grpo
rredcot attribute run.dir=$R $ex method=rredcot method.value=suffix_is method.is_self_normalised=false \
  method.advantage=immediate method.baseline=group_mean method.clip_reward=1.0 method.is_boundaries=matched \
  method.is_window=1 method.is_window_unit=segments method.is_clip=20.0 run.tag=rredcot
# a diagnostic beside the registered estimator: the likelihood ratio over the whole suffix (is_window=0)
rredcot judge run.dir=$R $ex judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[rredcot]' run.tag=window0 \
  +judge.params.rredcot.is_window=0
rredcot attribute run.dir=$R $ex method=rredcot method.value=suffix_is method.is_self_normalised=false \
  method.advantage=immediate method.baseline=group_mean method.clip_reward=1.0 method.is_boundaries=matched \
  method.is_window=0 method.is_window_unit=segments method.is_clip=20.0 run.tag=rredcot-window0
python bench/tail_credit.py $R/segment/segments.parquet grpo=$R/attribute-grpo/grpo rredcot=$R/attribute-rredcot/rredcot \
  rredcot_window0=$R/attribute-rredcot-window0/rredcot --reference $R/mc-reference/*.parquet --batches 5 --out $D/tail_credit.json
# (judge-traces/ is a copy of $R: samples, segments, the kept MC reference, both judges, the three attributions)

# --- 4. timing: 3 training steps per arm at the proposed budget's per-step shape (evals measured apart)
B="model=tiny-chain-tail benchmark=chain_tail benchmark.min_steps=8 benchmark.max_steps=12 segment=newline sampling.n=8
   sampling.temperature=1.0 sampling.max_new_tokens=224 train.prompts_per_step=8 train.updates_per_batch=2
   train.minibatch_size=32 train.steps=3 train.eval_every=0 train.eval_problems=16 train.eval_samples=4
   train.save_every=0 seed=0 train.data_order_seed=0"
rredcot train $B method=grpo method.scale_by_std=true run.dir=runs/b-emb-timing/grpo
rredcot train $B method=rredcot method.value=suffix_is method.is_self_normalised=false method.advantage=immediate \
  method.baseline=group_mean method.clip_reward=1.0 method.is_boundaries=matched method.is_window=1 \
  method.is_window_unit=segments method.is_clip=20.0 run.dir=runs/b-emb-timing/rredcot

# --- 5. which value estimator finds the free tail? (issue 37 item 4 / issue 39 item 5; estimators/)
# On the committed traces (judge-traces/ holds $R's samples, segments and the kept MC reference, so
# these judges reuse the reference and take seconds), at commit 2367efe: chain_tail's answer probe
# is "Answer: {answer}\n" (its format: the Notes follow the Answer line), no longer the inherited
# "Answer: {answer}{eos}". RREDCoT with value=answer_probe and value=answer_share, advantage
# immediate, beside the registered suffix_is row and the controls of section 3; answer_probe with the
# old EOS probe as the before-the-fix diagnostic.
E=$D/estimators
[ -d $R ] || cp -r $D/judge-traces $R
for v in answer_probe answer_share; do
  t=${v//_/-}
  rredcot judge run.dir=$R $ex judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[rredcot]' run.tag=$t \
    +judge.params.rredcot.value=$v
  rredcot attribute run.dir=$R $ex method=rredcot method.value=$v method.advantage=immediate method.baseline=group_mean \
    method.clip_reward=1.0 run.tag=rredcot-$t
done
rredcot judge run.dir=$R $ex judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[rredcot]' run.tag=answer-probe-eos \
  +judge.params.rredcot.value=answer_probe '+judge.params.rredcot.probe_template="Answer: {answer}{eos}"'
rredcot attribute run.dir=$R $ex method=rredcot method.value=answer_probe method.advantage=immediate method.baseline=group_mean \
  method.clip_reward=1.0 'method.probe_template="Answer: {answer}{eos}"' run.tag=rredcot-answer-probe-eos
python bench/tail_credit.py $R/segment/segments.parquet grpo=$R/attribute-grpo/grpo rredcot_suffix_is=$R/attribute-rredcot/rredcot \
  rredcot_answer_probe=$R/attribute-rredcot-answer-probe/rredcot rredcot_answer_share=$R/attribute-rredcot-answer-share/rredcot \
  rredcot_answer_probe_eos=$R/attribute-rredcot-answer-probe-eos/rredcot --reference $R/mc-reference/*.parquet --batches 5 \
  --out $E/tail_credit.json
# (estimators/ holds the three judges, their printed tables (*.log) and the three attributions, copied from $R)

# --- 6. the decided-prefix rule (issue 37 item 4 / issue 39 item 5; decided/)
# At the commit that adds it (branch decided-prefix): a prefix holding chain_tail's complete first
# Answer line is valued at the verifier's verdict on that prefix (benchmarks.base.decided_outcome,
# methods/rredcot.py), whatever the estimator says. The same committed traces, the same kept MC
# reference and 5 batches; each of the three estimators now with the rule, then the tail figures.
DD=$D/decided
[ -d $R ] || cp -r $D/judge-traces $R
for v in suffix_is answer_probe answer_share; do
  t=decided-${v//_/-}
  rredcot judge run.dir=$R $ex judge.batches=5 judge.reference_k=8 judge.reruns=1 'judge.methods=[rredcot]' run.tag=$t \
    +judge.params.rredcot.value=$v 2>&1 | tee $R/judge-$t.log
done
rredcot attribute run.dir=$R $ex method=rredcot method.value=suffix_is method.is_self_normalised=false \
  method.advantage=immediate method.baseline=group_mean method.clip_reward=1.0 method.is_boundaries=matched \
  method.is_window=1 method.is_window_unit=segments method.is_clip=20.0 run.tag=rredcot-decided-suffix-is
for v in answer_probe answer_share; do
  rredcot attribute run.dir=$R $ex method=rredcot method.value=$v method.advantage=immediate method.baseline=group_mean \
    method.clip_reward=1.0 run.tag=rredcot-decided-${v//_/-}
done
python bench/tail_credit.py $R/segment/segments.parquet grpo=$R/attribute-grpo/grpo \
  rredcot_suffix_is_decided=$R/attribute-rredcot-decided-suffix-is/rredcot \
  rredcot_answer_probe_decided=$R/attribute-rredcot-decided-answer-probe/rredcot \
  rredcot_answer_share_decided=$R/attribute-rredcot-decided-answer-share/rredcot \
  --reference $R/mc-reference/*.parquet --batches 5 --out $DD/tail_credit.json
# (decided/ holds the three judges, their printed tables (*.log, from the "judge · " line on) and the three
# attributions, copied from $R)
