for m in grpo rredcot; do
  /usr/bin/time -v timeout 100 python -m rredcot_cli train method=$m benchmark.min_steps=14 benchmark.max_steps=20 sampling.max_new_tokens=224 train.steps=3 train.prompts_per_step=8 sampling.n=8 train.eval_every=0 train.eval_problems=16 train.eval_samples=4 train.save_every=0 seed=0 train.data_order_seed=0 run.dir=runs/prereg-timing/$m run.overwrite=true > runs/prereg-timing/$m.log 2>&1
done
