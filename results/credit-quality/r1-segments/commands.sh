cd /work/main
export OMP_NUM_THREADS=2
R=runs/cq-r1
.venv/bin/python -m rredcot_cli sample run.dir=$R seed=0 sample.num_prompts=40 sampling.n=8
.venv/bin/python -m rredcot_cli segment run.dir=$R seed=0
.venv/bin/python -m rredcot_cli judge run.dir=$R seed=0 judge.batches=5 judge.reference_k=16 judge.reruns=3 'judge.methods=[grpo,rredcot]'
for w in 1 2 3; do
.venv/bin/python -m rredcot_cli judge run.dir=$R seed=0 judge.batches=5 judge.reference_k=16 judge.reruns=3 'judge.methods=[rredcot]' \
  run.tag=is-window-$w-segments +judge.params.rredcot.is_window=$w +judge.params.rredcot.is_window_unit=segments
done
