"""The accelerator check: the GPU path's first figures and checks in one run that fits a
10-minute lease of one H100/H200, with no hub access (random-init models of real shapes from the
configs in bench/configs/, and the embedded model).

The lease, step by step (the lent machine has no network: vLLM and a CUDA torch must already be
installed there, ``pip install -e ".[vllm,test]"``):

    python -c "import torch, vllm; print(torch.cuda.get_device_name(0), vllm.__version__)"   # ~10 s
    python bench/device_check.py --out results/device-check/<card>.json                      # ~6-8 min

The second command keeps to ``--budget-s`` (default 480 s: a 10-minute lease less the machine's
start and copying the results back): every part has an estimate of its H100 wall time, one whose
estimate no longer fits the time left is not started (its ``why`` in the JSON), and an RL run
still going when the budget runs out is stopped (``cut short``, with the steps it finished). The
checks that run in this process cannot be stopped midway: one that overran its estimate by a lot
is the one figure to distrust. The JSON is rewritten after every part, so a run cut short keeps
what finished, and the RL runs write their folders beside it (``<card>-runs/grpo/``,
``<card>-runs/rredcot/``: ``train/metrics.parquet`` after every step and ``phase_memory.json``
after every phase), which survive even a kill of the whole script. Copy both back. If the lease
ended early, the next one runs what is missing: ``--only model_1p5b rredcot_1p5b`` (the RL parts
need the model part of the same run), or ``--only logprobs sync memory``.

What to read in the JSON (``parts``; each has ``status``: ok, failed, skipped or cut short):

- ``grpo_1p5b`` / ``rredcot_1p5b``: ``after_warmup.s_per_step`` is the s/step beside each other
  (the first step warms up and is left out), ``after_warmup.phases`` where it goes (sampling,
  segment, credit, old_logprobs, update, refresh = wake-up and weight sync), ``steps[].phases``
  and ``steps[].rates`` each step's seconds and tokens/s per phase, ``phase_memory`` the peak
  memory per phase (``device_used_gib``: the whole GPU, vLLM included; ``torch_allocated_gib`` and
  ``torch_reserved_gib``: the CUDA allocator of the training process; ``host_peak_rss_gib``),
  ``ended`` how the run ended.
- ``logprobs``: max/p99 |log-prob difference| of vLLM vs the trainer per dtype and temperature;
  ``sync``: memory freed by sleep, the mismatch after a sync (should be at float rounding);
  ``memory``: peak memory of one 0.5B update; then ``throughput``, ``train``, ``colocated``.

The parts, in the order they run (the most valuable figures first):

1. ``model_1p5b``   random-init Qwen2.5-Math-1.5B (bench/configs/qwen2.5-math-1.5b/config.json,
                    the shape of conf/model/qwen2.5-math-1.5b.yaml: 1.54 B parameters, 28 layers,
                    hidden 1536, 12 heads / 2 KV heads, vocabulary 151,936) initialised on the GPU
                    in bf16 and saved with the character tokenizer (the Qwen tokenizer is on the
                    hub only), plus a question file of 256 GSM8K training problems.
2. ``grpo_1p5b``    ``rredcot train backend=vllm model=qwen2.5-math-1.5b model.path=<it>``, GRPO,
3. ``rredcot_1p5b`` then RREDCoT (answer_probe values), 3 steps each of 8 prompts x 8 samples x 512
                    new tokens, bf16 (fp32 master weights), sleep mode, the weights synced to the
                    engine after every update, conf/experiment/gsm8k_qwen.yaml's training options
                    (``rl_overrides``). Random weights never write EOS, so every completion runs to
                    512 tokens; they write no answer either, so the reward is whether a completion
                    decodes to any text (``wrote_text``): mixed groups, so GRPO's update is not
                    skipped as all-zero; segments are fixed 32-token pieces (16 per completion).
4. ``logprobs``     vLLM samples from the embedded model at T=1 and at T=0.7/top-p 0.9; the
                    sampled tokens' log-probs are compared with the trainer's
                    (``logprobs.completion_logprobs`` at the same temperature/top-p), fp32 and bf16.
5. ``sync``         sleep mode frees memory; a perturbed policy synced into the engine scores as the
                    HF model does; the original synced back scores as before.
6. ``memory``       one policy update of random-init Qwen2.5-0.5B at 1k tokens with the memory
                    options on (bf16-mixed, checkpointing, chunked LM head, micro-batch 1): peak
                    allocated/reserved CUDA memory, beside docs/studies/memory.md's derived numbers.
7. ``throughput``   tokens/s of the vLLM backend vs the HF backend generating the same prompts from
                    a random-init Qwen2.5-0.5B (bf16; fixed-length outputs).
8. ``train``        ``rredcot train backend=vllm`` on the embedded model for 3 steps, full
                    fine-tuning and LoRA, as subprocesses: wall time, per-step metrics
                    (sampler_kl is the sampler/trainer mismatch), peak GPU memory.
9. ``colocated``    with 2+ GPUs: ``torchrun --nproc-per-node=2 -m rredcot_cli train backend=vllm``,
                    an engine per rank colocated with its trainer (sleep mode on), for ddp and fsdp2,
                    then both ranks sharing one engine (``backend.tensor_parallel_size=2``), each
                    with ``backend.sync_check_atol`` checking every sync on every rank. Skipped on one
                    GPU (``--quick`` runs the ddp case on the CPU build instead).

How the 1.5B shape was chosen to fit: an ESTIMATE from first principles and stated assumptions,
not a measurement (none was possible: no GPU was lent when this was written). Per RL part:
~60 s of start-up (imports, loading 3 GB of weights into fp32 master weights, the vLLM engine's
weight load, memory profiling and KV-cache allocation, eager so without torch.compile or
CUDA-graph capture). Per step: sampling 64 x 512 = 32,768 tokens; a decode step of a 1.5B model
reads its ~3.1 GB of bf16 weights, >= ~1 ms at the H100's 3.35 TB/s, and in eager mode vLLM's
Python and kernel-launch overhead over 28 layers is assumed at 10-25 ms per step at batch 64,
so 512 steps take ~5-13 s (2,500-6,500 tokens/s; CUDA graphs would be faster, so the figure is a
floor). The trainer's passes cover ~64 x (~600 prompt characters + 512) ~ 70 k positions; at
2 x 1.5 G FLOPs per position a forward is ~2e14 FLOPs, ~0.6 s at an assumed 35% of the H100's
~990 dense bf16 TFLOP/s; old log-probs take one forward, the update with checkpointing ~4
forward-equivalents (~3 s), RREDCoT's credit about one more (16 probes per completion on the
prefix), the weight sync (wake + 3 GB copied in process) ~1-3 s. So ~10-20 s a step, ~60 s for
3, plus the held-out evals (1 problem x 1 sample, before and after) and the final checkpoint
(~20 s): ~2.5 min per method. The part estimates (45 + 150 + 170 s) leave ~2 min of the 480 s for
the checks after them, which the guard runs as they fit. Memory: vLLM takes 0.5 of the GPU
(``backend.gpu_memory_utilization``), freed by sleep during the update; the trainer holds fp32
weights + AdamW (~18 GiB) and, in the update, gradients (~6 GiB) and activations: well inside
78 GiB.

``--quick`` shrinks every size so the script can be smoke-run on a CPU with the CPU build of vLLM
(tests nothing a GPU adds; it checks the script itself): the 1.5B parts build the same config,
narrowed to 2 layers of width 128, by the same code path (build, random init, save, load by path),
and run 2 steps of 2 x 2 x 16 tokens. ``--budget-s`` defaults to no limit there. Nothing here
asserts; read the JSON.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Callable, NamedTuple

from measure import mean_step, one_update, optimizer_as_trained, proc_status, reset_peak_rss, train_steps

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN_05B = REPO / "bench" / "configs" / "qwen2.5-0.5b-instruct"
MATH_15B = REPO / "bench" / "configs" / "qwen2.5-math-1.5b"
# --quick builds the 1.5B part's model from the same config, narrowed, by the same code path.
NARROW = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=2,
              num_key_value_heads=1, max_window_layers=2, layer_types=["full_attention"] * 2)
# A 10-minute lease less ~2 minutes for the machine's start, the install and copying the JSON back.
LEASE_BUDGET_S = 480.0
PART_NAMES = ("model_1p5b", "grpo_1p5b", "rredcot_1p5b", "logprobs", "sync", "memory", "throughput", "train",
              "colocated")
TEXTS = ["Compute mod 10: 1 +2 *3 -4 +5\n", "Compute mod 10: 7 *7 -2\n", "x = 4\ny = x * 2\n",
         "Find the first x in 1 2 3 4 with (3x+1)%10=3\n"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "bench" / "device-check" / "device_check.json"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the script on CPU")
    parser.add_argument("--only", nargs="*", default=None, choices=PART_NAMES, metavar="PART",
                        help="run only these parts: " + " ".join(PART_NAMES))
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"wall seconds the whole run may take (default {LEASE_BUDGET_S:.0f}; --quick: no limit): "
                             "a part whose estimate no longer fits is skipped, and says so in the JSON")
    args = parser.parse_args()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    budget_s = args.budget_s if args.budget_s is not None else (float("inf") if args.quick else LEASE_BUDGET_S)
    result: dict = {"env": environment(device), "quick": args.quick, "command": " ".join(sys.argv),
                    "budget_s": None if budget_s == float("inf") else budget_s, "parts": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The RL runs' folders sit beside the JSON, so a run the lease cuts short leaves its metrics.
    runs_dir = out.with_name(out.stem + "-runs")
    has_vllm = importlib.util.find_spec("vllm") is not None
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for part in parts(device, args.quick, Path(work), runs_dir):
            if args.only is not None and part.name not in args.only:
                continue
            left = budget_s - (time.perf_counter() - began)
            why = skip_reason(part, left, budget_s, has_vllm)
            if why is not None:
                value = {"status": "skipped", "why": why}
                result["parts"][part.name] = value
                out.write_text(json.dumps(result, indent=2) + "\n")
                print(f"{part.name}: skipped ({value['why']})", file=sys.stderr)
                continue
            started = time.perf_counter()
            try:
                value = part.run(left)
                status = "ok"
            except Exception as e:  # noqa: BLE001 - a failed part is a result; the others still run
                value, status = {"error": f"{type(e).__name__}: {e}"}, "failed"
            value.update(status=value.get("status", status), seconds=round(time.perf_counter() - started, 1))
            result["parts"][part.name] = value
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"{part.name}: {value['status']} in {value['seconds']} s", file=sys.stderr)
            release(device)
    result["seconds"] = round(time.perf_counter() - began, 1)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["parts"], indent=2))


class Part(NamedTuple):
    name: str
    run: Callable[[float], dict]  # takes the wall seconds left in the budget, returns the part's result
    estimate_s: float  # its expected wall time on one H100: the guard skips it when this no longer fits
    needs_vllm: bool = True


def skip_reason(part: Part, left_s: float, budget_s: float, has_vllm: bool) -> str | None:
    """Why ``part`` does not run now, or None."""
    if part.needs_vllm and not has_vllm:
        return "vllm is not importable in this Python: pip install -e '.[vllm]' (before the lease: no network there)"
    if part.estimate_s > left_s:
        return f"its estimate ({part.estimate_s:.0f} s on one H100) is over the {max(left_s, 0):.0f} s left of " \
               f"--budget-s {budget_s:.0f}"
    return None


def parts(device: str, quick: bool, work: Path, runs_dir: Path) -> list[Part]:
    """The parts in the order they run: the 1.5B GRPO-vs-RREDCoT figures first, as the most
    valuable, then the checks on the embedded model and Qwen2.5-0.5B."""
    model_dir = work / "qwen2.5-math-1.5b-random"

    def rl(method: str) -> Callable[[float], dict]:
        return lambda left: check_rl_1p5b(method, model_dir, runs_dir / method, device, quick, left)

    return [
        Part("model_1p5b", lambda left: build_model_1p5b(model_dir, device, quick), 45, needs_vllm=False),
        Part("grpo_1p5b", rl("grpo"), 150),
        Part("rredcot_1p5b", rl("rredcot"), 170),
        Part("logprobs", lambda left: check_logprobs(device, quick), 60),
        Part("sync", lambda left: check_sync(device, quick), 45),
        Part("memory", lambda left: check_memory(device, quick), 40, needs_vllm=False),
        Part("throughput", lambda left: check_throughput(device, quick), 75),
        Part("train", lambda left: check_train(device, quick), 150),
        Part("colocated", lambda left: check_colocated(device, quick), 300),
    ]


# --------------------------------------------------------------------------- the 1.5B RL steps


class RLShape(NamedTuple):
    prompts: int  # train.prompts_per_step
    samples: int  # sampling.n (the group size)
    max_new_tokens: int  # every completion runs to it: random weights never write EOS
    steps: int  # train.steps; the first warms up (allocator, kernels), the later ones are the figures
    segment_tokens: int  # segment=fixed: tokens per segment (RREDCoT values one boundary per segment)


RL_SHAPE = RLShape(prompts=8, samples=8, max_new_tokens=512, steps=3, segment_tokens=32)
RL_SHAPE_QUICK = RLShape(prompts=2, samples=2, max_new_tokens=16, steps=2, segment_tokens=4)
QUESTIONS = "gsm8k-questions.jsonl"  # beside the model folder: benchmark=jsonl's file


def build_model_1p5b(model_dir: Path, device: str, quick: bool) -> dict:
    """A random-init Qwen2.5-Math-1.5B folder built from bench/configs/ (no hub): the weights, the
    character tokenizer, and beside it a question file of GSM8K training problems."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rredcot_cli.benchmarks.gsm8k import parse_gold
    from rredcot_cli.data import read_split
    from rredcot_cli.policy.model_files import save_tokenizer
    from rredcot_cli.policy.models import build_char_tokenizer

    config = AutoConfig.from_pretrained(MATH_15B, **(NARROW if quick else {}))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):  # initialised where it runs: seconds on a GPU, a minute or more on a CPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    # The Qwen tokenizer is on the hub only. Prompts are read one character a token (about 4x
    # the BPE count) and the ids the random model samples beyond the alphabet decode to nothing.
    save_tokenizer(build_char_tokenizer(), model_dir)
    del model
    records = islice(read_split("gsm8k", "train"), 256)
    lines = [json.dumps({"question": row["question"], "answer": parse_gold(row["answer"])}) for _, row in records]
    (model_dir.parent / QUESTIONS).write_text("\n".join(lines) + "\n")
    return {"config": str(MATH_15B.relative_to(REPO)) + (" (narrowed for --quick)" if quick else ""),
            "parameters": parameters, "dtype": str(dtype), "weights_gib": round(_weight_bytes(model_dir) / 2**30, 3),
            "build_seconds": round(time.perf_counter() - started, 1)}


def rl_overrides(method: str, model_dir: Path, device: str, shape: RLShape) -> list[str]:
    """``rredcot train`` settings of the 1.5B part: conf/experiment/gsm8k_qwen.yaml's training
    options on the 1.5B preset at ``shape``, backend vllm with sleep mode and a sync every step."""
    overrides = [
        "model=qwen2.5-math-1.5b", f"model.path={model_dir}",
        "model.dtype=bfloat16" if device == "cuda" else "model.dtype=float32",
        # Eager: no torch.compile or CUDA-graph capture at each of the two engine starts (a minute or
        # more of a 10-minute lease); decode is slower than with graphs, so its tokens/s is a floor.
        "backend=vllm", "backend.enforce_eager=true", f"method={method}",
        # Random weights write no answer, so a real verifier scores every completion 0 and GRPO's
        # update, with every advantage 0, is skipped (update.carries_no_signal). wrote_text scores 1
        # the completions that decode to any text, so the groups are mixed and both methods run
        # their whole update, as on a real task.
        "benchmark=jsonl", f"benchmark.path={model_dir.parent / QUESTIONS}", "benchmark.extractor=none",
        "benchmark.verifier=bench.device_check:wrote_text",
        # Random text has no line breaks to cut at: fixed segments give RREDCoT a realistic count.
        "segment=fixed", f"segment.tokens={shape.segment_tokens}",
        f"sampling.n={shape.samples}", f"train.prompts_per_step={shape.prompts}",
        f"sampling.max_new_tokens={shape.max_new_tokens}", "sampling.temperature=1.0", f"train.steps={shape.steps}",
        f"train.minibatch_size={shape.prompts * shape.samples}", "train.micro_batch_size=4",
        "train.gradient_checkpointing=true", "train.logprob_chunk_tokens=1024",
        "train.sampler_correction=token_truncate", "train.lr=1e-6", "train.warmup_steps=0", "train.kl_coef=0.0",
        "train.eval_every=0", "train.save_every=0", "train.eval_problems=1", "train.eval_samples=1",
    ]
    if method == "rredcot":
        # extractor=none has no forced-answer probe of its own; this is GSM8K's ("The final answer is
        # $\boxed{...}$") less the box: about the same tokens scored per boundary.
        overrides.append("method.probe_template='The final answer is {answer}'")
    return overrides


def check_rl_1p5b(method: str, model_dir: Path, run: Path, device: str, quick: bool, left_s: float) -> dict:
    """``rredcot train backend=vllm`` on the random-init 1.5B model for ``shape.steps`` steps of
    ``method``: per step and phase, seconds and tokens/s; per phase, peak GPU memory."""
    if not (model_dir / "config.json").is_file():
        return {"status": "skipped", "why": "no model: part model_1p5b did not run or failed"}
    shape = RL_SHAPE_QUICK if quick else RL_SHAPE
    overrides = rl_overrides(method, model_dir, device, shape)
    if run.exists():
        shutil.rmtree(run)  # an earlier run's metrics must not pass for this one's
    run.mkdir(parents=True)
    memory_file = run / "phase_memory.json"
    command = [sys.executable, "-c", "from bench.device_check import train_child; train_child()",
               "train", f"run.dir={run}", *overrides]
    # bench/ on the path as for a script (device_check imports measure), the repository for the
    # verifier's name bench.device_check:wrote_text
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "bench")]), MEMORY_ENV: str(memory_file)}
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=run, capture_output=True, text=True, env=env,
                              timeout=None if left_s == float("inf") else max(left_s, 1.0))
        ended, stderr = ("ok" if proc.returncode == 0 else f"exit {proc.returncode}"), proc.stderr
    except subprocess.TimeoutExpired as e:  # the budget ran out: what the steps wrote so far is the result
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        ended = f"cut short by --budget-s after {time.perf_counter() - started:.0f} s"
    # The final checkpoint is GBs of random weights: nothing to read, and too big to copy back.
    shutil.rmtree(run / "train" / "checkpoints", ignore_errors=True)
    steps = step_figures(train_steps(run / "train") if (run / "train" / "metrics.parquet").exists() else [],
                         _weight_bytes(model_dir))
    report = {"method": method, "shape": shape._asdict(), "run_dir": str(run), "ended": ended,
              "wall_seconds": round(time.perf_counter() - started, 1), "steps": steps,
              "after_warmup": mean_step(steps[1:] or steps) if steps else None,
              "phase_memory": json.loads(memory_file.read_text()) if memory_file.exists() else None,
              "overrides": overrides}
    if ended != "ok":
        report.update(status="failed" if ended.startswith("exit") else "cut short", stderr_tail=stderr[-3000:])
    return report


# What a phase's tokens/s counts: the positions the credit method ran through the model for
# credit, the step's generated tokens for sampling and the trainer's passes (bench/throughput.py's
# rule); refresh (the weight sync) gets GiB/s of weights instead, segment (text on the CPU) no rate.
RATED_PHASES = ("sampling", "credit", "old_logprobs", "update")


def step_figures(steps: list[dict], weight_bytes: int) -> list[dict]:
    """``measure.train_steps``' steps as the JSON keeps them: each step's seconds, tokens and
    metrics, its phases' seconds, and a rate per phase."""
    figures = []
    for step in steps:
        row, phases = step["row"], step["phases"]
        rates = {}
        for name in RATED_PHASES:
            count = row.get("credit_forward_tokens") if name == "credit" else step["tokens"]
            rates[f"{name}_tokens_per_s"] = round(count / phases[name], 1) if count and phases[name] else None
        refresh = phases["refresh"]
        rates["refresh_weights_gib_per_s"] = round(weight_bytes / 2**30 / refresh, 2) if refresh else None
        figures.append({"step": row["step"], "seconds": round(row["seconds"], 3), "tokens": step["tokens"],
                        "credit_forward_tokens": row.get("credit_forward_tokens"), "reward_mean": row["reward_mean"],
                        "loss": row["loss"], "grad_norm": row["grad_norm"], "sampler_kl": row.get("sampler_kl"),
                        "phases": {name: round(seconds, 3) for name, seconds in phases.items()}, "rates": rates})
    return figures


def wrote_text(answer: str, gold: str) -> bool:
    """The 1.5B part's verifier (``benchmark.verifier=bench.device_check:wrote_text`` with
    ``extractor=none``): 1 for a completion that decodes to any text. The jsonl benchmark scores an
    empty completion 0 before calling it. A random model's completion is empty unless it sampled
    one of the character tokenizer's 100 ids among 151,936: near-uniform sampling does so at least
    once in 512 tokens with probability 1 - exp(-512 * 100 / 151936) ~ 0.29, so about 7% of
    groups of 8 (0.71^8) are all 0 and the others carry an advantage."""
    return bool(answer.strip())


# --------------------------------------------------------------------------- per-phase memory

MEMORY_ENV = "DEVICE_CHECK_PHASE_MEMORY"  # where train_child writes PhaseMemory's figures


def train_child() -> None:
    """``rredcot <args>`` with a ``PhaseMemory`` watching the train loop's phases: the child process
    of ``check_rl_1p5b``. Its figures are rewritten after each phase, so a run cut short keeps them."""
    from rredcot_cli.cli import main as rredcot
    from rredcot_cli.train import steptime

    steptime.PHASE_OBSERVERS.append(PhaseMemory(Path(os.environ[MEMORY_ENV])).observe)
    sys.argv = ["rredcot", *sys.argv[1:]]
    rredcot()


class PhaseMemory:
    """Peak memory per phase of the train loop, over all steps: the CUDA caching allocator's peak
    allocated and reserved bytes in this process (the trainer and the in-process vLLM engine) and
    the device's used memory (total - free, whatever allocator or process holds it) polled every
    20 ms; and the process's resident peak (``host_peak_rss_gib``, the only figure without CUDA).
    A phase opened inside another (old_logprobs inside update) counts in both."""

    def __init__(self, out: Path) -> None:
        import torch

        self.out, self.cuda = out, torch.cuda.is_available()
        self.open: list[str] = []
        self.peaks: dict[str, dict[str, float]] = {}
        self.device_used = 0
        self.polling = False

    def observe(self, event: str, name: str) -> None:
        if self.cuda and not self.polling:
            # Started at the first phase, not before: by then the trainer and the engine have set
            # up CUDA their own way (and vLLM has profiled memory with the peak counters this resets).
            import threading

            threading.Thread(target=self._poll, daemon=True).start()
            self.polling = True
        peak = self._take_peak()
        for phase in self.open:
            held = self.peaks.setdefault(phase, {})
            for key, value in peak.items():
                held[key] = max(held.get(key, 0.0), value)
        if event == "begin":
            self.open.append(name)
            return
        self.open.remove(name)
        self.out.write_text(json.dumps({phase: {k: round(v, 3) for k, v in figures.items()}
                                        for phase, figures in self.peaks.items()}, indent=2) + "\n")

    def _take_peak(self) -> dict[str, float]:
        """The peaks since the last call, in GiB; the counters restart from here."""
        import torch

        peak = {"host_peak_rss_gib": proc_status("VmHWM") / 2**30}
        reset_peak_rss()
        if self.cuda:
            peak.update(torch_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                        torch_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                        device_used_gib=max(self.device_used, self._used()) / 2**30)
            torch.cuda.reset_peak_memory_stats()
            self.device_used = self._used()
        return peak

    def _poll(self) -> None:
        while True:
            self.device_used = max(self.device_used, self._used())
            time.sleep(0.02)

    @staticmethod
    def _used() -> int:
        import torch

        free, total = torch.cuda.mem_get_info()
        return total - free


def _weight_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


# --------------------------------------------------------------------------- parts


def check_logprobs(device: str, quick: bool) -> dict:
    """Sampled-token log-probs of vLLM vs the trainer's, on the embedded model."""
    import torch

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.vllm import VLLMBackend
    from rredcot_cli.policy.logprobs import completion_logprobs
    from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path

    path = resolve_model_path("embedded")
    report = {}
    for dtype in ("float32", "bfloat16"):
        model, tok = load_model_and_tokenizer(path, dtype="float32", device=device)
        engine = VLLMBackend(path, tokenizer=tok, dtype=dtype, device=device, enforce_eager=True, seed=0,
                             sleep_mode="false")
        prompts = [tok(t)["input_ids"] for t in TEXTS]
        autocast = torch.autocast(device, dtype=torch.bfloat16) if dtype == "bfloat16" else _null()
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
            params = SamplingParams(n=2 if quick else 16, max_new_tokens=32 if quick else 256,
                                    temperature=temperature, top_p=top_p)
            groups = engine.generate(prompts, params, seed=1)
            p_rows = [p for p, g in zip(prompts, groups) for _ in g]
            c_rows = [c.token_ids for g in groups for c in g]
            sampled = torch.cat([torch.tensor(c.logprobs) for g in groups for c in g])
            with torch.no_grad(), autocast:
                lp, mask, _ = completion_logprobs(model, p_rows, c_rows, tok.pad_token_id, False,
                                                  temperature=temperature, top_p=top_p, chunk_tokens=1024)
            diff = (lp[mask].float().cpu() - sampled).abs()
            report[f"{dtype} T={temperature} top_p={top_p}"] = {
                "tokens": int(diff.numel()), "max_abs_diff": float(diff.max()),
                "p99_abs_diff": float(diff.quantile(0.99)), "mean_abs_diff": float(diff.mean()),
                # k1 estimate of KL(sampler || trainer): what train.sampler_correction corrects
                "sampler_kl": float((sampled - lp[mask].float().cpu()).mean()),
            }
        engine.close()
        del engine, model
        release(device)
    return report


def check_sync(device: str, quick: bool) -> dict:
    """Sleep frees memory; a synced perturbed policy scores as the HF model does."""
    import torch

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.vllm import VLLMBackend
    from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path

    path = resolve_model_path("embedded")
    model, tok = load_model_and_tokenizer(path, dtype="float32", device=device)
    engine = VLLMBackend(path, tokenizer=tok, dtype="float32", device=device, enforce_eager=True, seed=0,
                         gpu_memory_utilization=0.3)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    groups = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=32), seed=2)
    p_rows = [p for p, g in zip(prompts, groups) for _ in g]
    c_rows = [c.token_ids for g in groups for c in g]
    before, _ = engine.score(p_rows, c_rows)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.02 * torch.randn_like(p))
    free_awake = _free_bytes(device)
    started = time.perf_counter()
    engine.sleep()
    slept = time.perf_counter() - started
    free_asleep = _free_bytes(device)
    started = time.perf_counter()
    engine.sync_weights(perturbed)
    synced = time.perf_counter() - started
    after, _ = engine.score(p_rows, c_rows)
    target, _ = HFBackend(perturbed, tok, device=device).score(p_rows, c_rows)
    engine.sync_weights(model)
    restored, _ = engine.score(p_rows, c_rows)
    engine.close()
    return {
        "sleep_mode": engine.sleep_mode, "in_process": engine.in_process,
        "freed_by_sleep_gib": None if free_awake is None else round((free_asleep - free_awake) / 2**30, 3),
        "sleep_seconds": round(slept, 3), "wake_and_sync_seconds": round(synced, 3),
        "scores_moved": _max_diff(before, after), "mismatch_after_sync": _max_diff(after, target),
        "mismatch_after_restore": _max_diff(restored, before),
    }


def check_train(device: str, quick: bool) -> dict:
    """``rredcot train backend=vllm`` for 3 steps, full fine-tuning and LoRA."""
    from rredcot_cli.store import metrics_log

    report = {}
    common = ["backend=vllm", "experiment=quick", "train.steps=3", "train.eval_every=0", "train.save_every=0",
              "model.dtype=bfloat16" if device == "cuda" else "model.dtype=float32",
              "train.gradient_checkpointing=true", "train.sampler_correction=token_truncate",
              "backend.enforce_eager=true"]
    if not quick:
        common += ["sampling.n=8", "train.prompts_per_step=8", "sampling.max_new_tokens=256",
                   "benchmark.min_steps=4", "benchmark.max_steps=12", "train.minibatch_size=32"]
    for name, extra in (("full", []), ("lora", ["model.lora.r=8", "train.lr=1e-4"])):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            code = ("import json, sys, torch; from rredcot_cli.cli import main; sys.argv = ['rredcot'] + sys.argv[1:];\n"
                    "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
                    "peak = torch.cuda.max_memory_reserved() if torch.cuda.is_available() else None\n"
                    "print('PEAK_RESERVED', peak); sys.exit(code)")
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", code, "train", f"run.dir={run}", *common, *extra],
                                  cwd=tmp, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            seconds = time.perf_counter() - started
            if proc.returncode != 0:
                report[name] = {"error": proc.stderr[-3000:], "seconds": round(seconds, 1)}
                continue
            metrics = metrics_log.read(run / "train" / "metrics.parquet").to_pylist()
            peak = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("PEAK_RESERVED")]
            report[name] = {
                "seconds": round(seconds, 1),
                "steps": [{k: m[k] for k in ("step", "reward_mean", "loss", "sampler_kl", "grad_norm", "seconds",
                                              "response_tokens_mean")} for m in metrics],
                "trainer_peak_reserved_gib": None if not peak or peak[0] == "None" else round(int(peak[0]) / 2**30,
                                                                                              2),
                "overrides": common + extra,
            }
    return report


def check_colocated(device: str, quick: bool) -> dict:
    """``backend=vllm`` under torchrun on 2 GPUs: an engine per rank (ddp, fsdp2), then one engine
    shared by both ranks (tensor_parallel_size 2)."""
    from rredcot_cli.store import metrics_log
    import torch

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    if gpus < 2 and not quick:
        return {"skipped": f"needs 2 GPUs, found {gpus}"}
    # fp32 so the check's tolerance is the kernels' rounding (bf16 engines differ from the trainer by more).
    common = ["backend=vllm", "experiment=quick", "train.steps=3", "train.eval_every=3", "train.save_every=0",
              "model.dtype=float32", "backend.enforce_eager=true", "backend.batch_size=0",
              f"backend.sync_check_atol={1e-3 if device == 'cuda' else 1e-4}", "train.dist_timeout_s=300"]
    if device == "cuda":
        common += ["backend.gpu_memory_utilization=0.3"]
    cases = {"ddp": ["train.parallel=ddp"], "fsdp2": ["train.parallel=fsdp2"],
             "ddp_tp2": ["train.parallel=ddp", "backend.tensor_parallel_size=2"]}
    if device != "cuda":
        cases = {"ddp": cases["ddp"]}  # --quick on the CPU build: the script itself
    report = {"gpus": gpus}
    for name, extra in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc-per-node=2",
                                   "-m", "rredcot_cli", "train", f"run.dir={run}", *common, *extra],
                                  cwd=tmp, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
            seconds = time.perf_counter() - started
            if proc.returncode != 0:
                report[name] = {"error": proc.stderr[-3000:], "seconds": round(seconds, 1)}
                continue
            metrics = metrics_log.read(run / "train" / "metrics.parquet").to_pylist()
            manifest = json.loads((run / "train" / "manifest.json").read_text())
            report[name] = {
                "seconds": round(seconds, 1),
                "steps": [{k: m[k] for k in ("step", "reward_mean", "loss", "mismatch_logp_abs_max", "grad_norm",
                                              "seconds")} for m in metrics],
                "weight_sync": manifest["extra"].get("weight_sync"),
                "overrides": common + extra,
            }
    return report


def check_throughput(device: str, quick: bool) -> dict:
    """Generated tokens/s, vLLM backend vs HF backend, same prompts, random-init Qwen2.5-0.5B."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.vllm import VLLMBackend
    from rredcot_cli.policy.model_files import save_tokenizer
    from rredcot_cli.policy.models import build_char_tokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    prompts_n, new_tokens = (4, 16) if quick else (64, 512)
    tok = build_char_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        # --quick is a CPU smoke run: the same code on a narrow model.
        narrow = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                      num_key_value_heads=1, max_window_layers=2, layer_types=["full_attention"] * 2) if quick else {}
        config = AutoConfig.from_pretrained(QWEN_05B, **narrow)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(tmp)
        save_tokenizer(tok, tmp)  # random weights emit ids the char tokenizer drops: text is not the point
        prompts = [[(7 * i + k) % 90 + 3 for k in range(64)] for i in range(prompts_n)]
        params = SamplingParams(n=1, max_new_tokens=new_tokens, temperature=1.0)
        report = {"model": "random-init Qwen2.5-0.5B" + (" (narrowed for --quick)" if quick else ""),
                  "dtype": str(dtype), "prompts": prompts_n, "prompt_tokens": 64, "max_new_tokens": new_tokens}

        engine = VLLMBackend(tmp, tokenizer=tok, dtype="bfloat16" if device == "cuda" else "float32", device=device,
                             seed=0, sleep_mode="false", gpu_memory_utilization=0.4)
        engine.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=8), seed=0)  # warm-up
        report["vllm"] = _timed_generate(engine, prompts, params)
        engine.close()
        del engine
        release(device)

        hf = HFBackend(model.to(device).eval(), tok, batch_size=prompts_n, device=device)
        hf.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=8), seed=0)
        report["hf"] = _timed_generate(hf, prompts, params)
    report["vllm_over_hf"] = round(report["vllm"]["tokens_per_s"] / report["hf"]["tokens_per_s"], 2)
    return report


def check_memory(device: str, quick: bool) -> dict:
    """Peak CUDA memory of one policy update at Qwen2.5-0.5B shape, 1k tokens, options on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rredcot_cli.policy.logprobs import ForwardPass
    # the model is prepared and stepped as the train stage does it (bench/measure.py says why one
    # update reaches into rredcot_cli.train)
    from rredcot_cli.train import trainable
    from rredcot_cli.train.precision import GradientStepper, resolve_precision

    if device != "cuda" and not quick:
        return {"skipped": "needs CUDA (CPU memory is what bench/memory.py measures)"}
    config = AutoConfig.from_pretrained(QWEN_05B, **({"num_hidden_layers": 2, "max_window_layers": 2,
                                        "layer_types": ["full_attention"] * 2}
                                                      if quick else {}))
    seq, rows = (64, 2) if quick else (1024, 4)
    precision = resolve_precision("bf16-mixed", "bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    model = trainable.prepare(model, precision, gradient_checkpointing=True)
    optimizer, scheduler = optimizer_as_trained(model, 1e-6, device)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 150000, (128,), generator=generator).tolist() for _ in range(rows)]
    completions = [torch.randint(3, 150000, (seq - 128 if not quick else seq // 2,), generator=generator).tolist()
                   for _ in range(rows)]
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, len(completions[0])).clone()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    forward = ForwardPass(chunk_tokens=1024, micro_batch_size=1, autocast=lambda: precision.autocast(device))
    started = time.perf_counter()
    one_update(model, optimizer, scheduler, {"prompt_ids": prompts, "completion_ids": completions,
                                             "advantages": advantages, "pad_id": 0, "max_tokens": seq},
               forward, GradientStepper(precision, device), generator)
    report = {"model": "random-init Qwen2.5-0.5B" + (" (2 layers, --quick)" if quick else ""), "tokens": seq,
              "rows": rows, "micro_batch_size": 1, "options": "bf16-mixed + gradient checkpointing + chunk 1024",
              "update_seconds": round(time.perf_counter() - started, 2)}
    if device == "cuda":
        report["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        report["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    return report


# --------------------------------------------------------------------------- helpers


def environment(device: str) -> dict:
    import torch
    import transformers

    from rredcot_cli.store.runs import _versions

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "vllm": _versions().get("vllm"), "device": device, "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    return env


def _timed_generate(backend, prompts, params) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    groups = backend.generate(prompts, params, seed=3)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return {"seconds": round(seconds, 3), "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b))


def _free_bytes(device: str) -> int | None:
    import torch

    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def _null():
    from contextlib import nullcontext

    return nullcontext()


def release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
