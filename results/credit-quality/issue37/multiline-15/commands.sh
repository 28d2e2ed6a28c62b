#!/usr/bin/env bash
# The 15-batch multi-line judge (PLAN.md). Run from the repository root at commit 7114ecd or later
# (split() was inline then; it now calls split_batches.py, the same code, shared with rejudge-packed/go.sh).
# OMP_NUM_THREADS=1; the machine ran the where-credit-pays study beside it (load ~2-3).
set -euo pipefail
export OMP_NUM_THREADS=1
model="model=smollm2-135m-instruct model.chat_template=false benchmark=arith_multiline sampling.max_new_tokens=96"
J=results/credit-quality/issue37/multiline-15; mkdir -p $J/logs
split() {  # cut a sample+segment run into batches of 2 prompt groups: split SRC PREFIX BATCHES
  python results/credit-quality/issue37/multiline-15/split_batches.py "$@"
}
# --- batches 1-5: the first judge's traces again (seed 1, test split) and its kept MC references
rredcot sample run.dir=runs/jd seed=1 $model sample.num_prompts=10 sampling.n=8
rredcot segment run.dir=runs/jd seed=1 $model
split runs/jd runs/jd-b 5
for b in 1 2 3 4 5; do
  mkdir -p runs/jd-b$b/mc-reference
  cp results/credit-quality/issue37/multiline/judge/b$b/mc-reference/* runs/jd-b$b/mc-reference/
done
# --- batches 6-15: seed 2, the train split's first 20 questions
rredcot sample run.dir=runs/jd2 seed=2 $model sample.split=train sample.num_prompts=20 sampling.n=8
rredcot segment run.dir=runs/jd2 seed=2 $model
split runs/jd2 runs/jd2-b 10
# --- the judges, one batch at a time; the first of each batch computes (or reuses) the MC reference
judge() {  # judge RUN SEED NAME
  common="run.dir=$1 seed=$2 $model judge.batches=1 judge.reference_k=8 judge.reruns=1"
  rredcot judge $common 'judge.methods=[grpo,rredcot]' run.tag=answer-probe
  rredcot judge $common 'judge.methods=[rredcot]' run.tag=suffix-is +judge.params.rredcot.value=suffix_is
  rredcot judge $common 'judge.methods=[rredcot]' run.tag=answer-share +judge.params.rredcot.value=answer_share
  mkdir -p $J/judge/$3 && cp -r $1/judge-* $1/mc-reference $J/judge/$3/
}
for b in 1 2 3 4 5; do judge runs/jd-b$b 1 b$b > $J/logs/b$b.txt 2>&1; done
for b in $(seq 1 10); do judge runs/jd2-b$b 2 b$((b + 5)) > $J/logs/b$((b + 5)).txt 2>&1; done
tables() { for b in $(seq 1 15); do printf '%s,' $J/judge/b$b/judge-$1/credit_quality.parquet; done | sed 's/,$//'; }
python bench/judge_compare.py answer_probe=$(tables answer-probe) suffix_is=$(tables suffix-is) \
  answer_share=$(tables answer-share) --out $J/judge_compare.json | tee $J/judge_table.md

# How it actually ran (2026-12-06): the judge loop above ran as a script from 12:10 UTC; at 13:00 a
# second worker started on the new batches from the end (runs/jd2-b10 down to b6; its logs are the
# *-w2.txt files) to take a larger share of the busy CPU. The two met at runs/jd2-b8: the first
# worker's judge of it was refused by the run-folder lock while the second's wrote it, and the
# first worker stopped there (logs/b13.txt); the second found jd2-b7 and b6 already judged and
# skipped them ("up to date"). Every batch was judged once, with the same commit and commands.
# Batch 6 (runs/jd2-b1) computed its MC reference in 13 min, busy.

# --- exploratory, written after the results were seen (not in PLAN.md): the same inner boundaries
# split into decided (the closed Answer: line is in the prefix) and undecided ones
python $J/undecided.py > $J/undecided.md

# --- the first 5 batches alone, re-judged with the decided answer line (against ../multiline/'s
# table without it): the rule's own effect on the same traces and references
tables5() { for b in 1 2 3 4 5; do printf '%s,' $J/judge/b$b/judge-$1/credit_quality.parquet; done | sed 's/,$//'; }
python bench/judge_compare.py answer_probe=$(tables5 answer-probe) suffix_is=$(tables5 suffix-is) \
  answer_share=$(tables5 answer-share) --out $J/judge_compare_b1-5.json > $J/judge_table_b1-5.md
