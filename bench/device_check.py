"""The accelerator check: everything the GPU path needs, in one run of a few minutes, with no hub
access (the embedded model and random-init models of real shapes from bench/configs/).

    pip install torch==<your CUDA build> && pip install -e ".[vllm,test]"
    python bench/device_check.py --out results/device-check/device_check.json        # on one GPU, <= 8 min

It runs, in order, and writes each result into the JSON as soon as it has it (a run cut short
keeps what finished):

1. ``logprobs``   vLLM samples from the embedded model at T=1 and at T=0.7/top-p 0.9; the
                  sampled tokens' log-probs are compared with the trainer's
                  (``logprobs.completion_logprobs`` at the same temperature/top-p), fp32 and bf16.
2. ``sync``       sleep mode frees memory; a perturbed policy synced into the engine scores as the
                  HF model does; the original synced back scores as before.
3. ``train``      ``rredcot train backend=vllm`` for 3 steps (bf16, sleep mode, syncs every step),
                  full fine-tuning and LoRA, as subprocesses: wall time, per-step metrics
                  (sampler_kl is the sampler/trainer mismatch), peak GPU memory.
4. ``throughput`` tokens/s of the vLLM backend vs the HF backend generating the same prompts from
                  a random-init Qwen2.5-0.5B (bf16; fixed-length outputs: random weights never
                  stop early).
5. ``memory``     one policy update of random-init Qwen2.5-0.5B at 1k tokens with the memory
                  options on (bf16-mixed, checkpointing, chunked LM head, micro-batch 1): peak
                  allocated/reserved CUDA memory, to set beside docs/studies/memory.md's derived numbers.
6. ``colocated``  with 2+ GPUs: ``torchrun --nproc-per-node=2 -m rredcot_cli train backend=vllm``,
                  an engine per rank colocated with its trainer (sleep mode on), for ddp and fsdp2,
                  then both ranks sharing one engine (``backend.tensor_parallel_size=2``), each
                  with ``backend.sync_check_atol`` checking every sync on every rank: wall time,
                  per-step metrics, the manifest's per-rank sync record. Skipped on one GPU
                  (``--quick`` runs the ddp case on the CPU build instead).

``--quick`` shrinks every size so the script can be smoke-run on a CPU with the CPU build of vLLM
(tests nothing a GPU adds; it checks the script itself). Nothing here asserts; read the JSON.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import one_update, optimizer_as_trained

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN_05B = REPO / "bench" / "configs" / "qwen2.5-0.5b-instruct"
TEXTS = ["Compute mod 10: 1 +2 *3 -4 +5\n", "Compute mod 10: 7 *7 -2\n", "x = 4\ny = x * 2\n",
         "Find the first x in 1 2 3 4 with (3x+1)%10=3\n"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "bench" / "device-check" / "device_check.json"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the script on CPU")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these parts: logprobs sync train throughput memory colocated")
    args = parser.parse_args()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result: dict = {"env": environment(device), "quick": args.quick, "command": " ".join(sys.argv), "parts": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = [("logprobs", check_logprobs), ("sync", check_sync), ("train", check_train),
             ("throughput", check_throughput), ("memory", check_memory), ("colocated", check_colocated)]
    for name, part in parts:
        if args.only is not None and name not in args.only:
            continue
        started = time.perf_counter()
        try:
            value = part(device, args.quick)
            status = "ok"
        except Exception as e:  # noqa: BLE001 - a failed part is a result; the others still run
            value, status = {"error": f"{type(e).__name__}: {e}"}, "failed"
        value.update(status=status, seconds=round(time.perf_counter() - started, 1))
        result["parts"][name] = value
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{name}: {status} in {value['seconds']} s", file=sys.stderr)
        release(device)
    print(json.dumps(result["parts"], indent=2))


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
