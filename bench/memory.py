"""Peak memory of one policy update at real shapes, with each training memory option on and off.

Each point builds a random-init Qwen2.5 model from a shipped ``config.json`` (bench/configs/, no
hub), optionally at reduced depth, prepares it as ``rredcot train`` does (``trainable.prepare``:
precision, LoRA, gradient checkpointing), builds ``ForwardPass``, ``GradientStepper`` and AdamW
as rredcot_cli/train/loop.py does (``precision.make_optimizer``), and runs one ``update.policy_update`` (old-log-prob pre-pass,
forward/backward per micro-batch, AdamW step) on random token ids. Every point runs in a fresh
subprocess whose address space is capped (``--cap-gb``), so a configuration that does not fit
fails with an allocation error, recorded as status ``does_not_fit``, instead of waking the OOM
killer. Per point it records:

  rss_imports   resident memory after importing torch/transformers/peft (the process floor)
  rss_setup     after building the model and AdamW with its moments allocated (the state every
                update starts from: the moments are primed by one zero step, and policy_update
                frees the gradients at its end)
  peak_update   the resident high-water mark during ``policy_update`` alone (VmHWM, reset through
                /proc/self/clear_refs just before it); with ``updates`` > 1, of the last update
  peak_setup    the high-water mark of building and setting up (before the update)
  phase_peaks   the high-water mark of each phase of the update: prepass (old log-probs),
                forward (a micro-batch's forward and loss), backward, step (clipping + AdamW)

glibc is told to mmap every allocation of 128 KiB or more (MALLOC_MMAP_THRESHOLD_), so a freed
tensor leaves the resident set at once and RSS follows live tensor bytes instead of malloc's
retained heap.

    python bench/memory.py --quick                         # one small point, < 1 min
    python bench/memory.py --plan full --out results/memory/memory.json
    python bench/memory.py --models qwen2.5-0.5b --lengths 1024 --options all,lora_all --layers 2,6

The fits-on tables (whole-model, GPU-side estimates from these measurements) are
bench/memory_derive.py's: ``python bench/memory_derive.py results/memory/memory.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from measure import (PhaseMeter, cpuinfo, mem_total_bytes, metered_stepper, one_update, optimizer_as_trained,
                     prime_moments, proc_status, reset_peak_rss, state_bytes)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = {  # name -> folder holding the config.json the model is built from
    "qwen2.5-0.5b": HERE / "configs" / "qwen2.5-0.5b-instruct",
    "qwen2.5-1.5b": HERE / "configs" / "qwen2.5-1.5b-instruct",
    "qwen2.5-7b": HERE / "configs" / "qwen2.5-7b-instruct",
}
PROMPT_TOKENS = 128
PAD_ID = 151643  # Qwen2.5's <|endoftext|>, its pad token
LORA_ALPHA = 32.0  # model.lora.alpha's default
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}


@dataclass(frozen=True)
class Options:
    """The training memory options of one point (train.* / model.lora.* in the config)."""

    precision: str = "bf16-mixed"  # train.precision
    gradient_checkpointing: bool = False  # train.gradient_checkpointing
    logprob_chunk_tokens: int = 0  # train.logprob_chunk_tokens (0: one pass)
    micro_batch_size: int = 0  # train.micro_batch_size (0: the whole minibatch per pass)
    lora_r: int = 0  # model.lora.r (0: full fine-tuning); all-linear, alpha 32, dropout 0


BASE = Options()
ALL = Options(gradient_checkpointing=True, logprob_chunk_tokens=1024, micro_batch_size=1)
OPTION_SETS = {
    "baseline": BASE,
    "chunk": dataclasses.replace(BASE, logprob_chunk_tokens=1024),
    "ckpt": dataclasses.replace(BASE, gradient_checkpointing=True),
    "micro1": dataclasses.replace(BASE, micro_batch_size=1),
    "ckpt_chunk": dataclasses.replace(ALL, micro_batch_size=0),
    "all": ALL,
    "bf16true_all": dataclasses.replace(ALL, precision="bf16-true"),
    "lora_all": dataclasses.replace(ALL, lora_r=16),
}


@dataclass(frozen=True)
class Point:
    model: str
    layers: int  # decoder layers built (the config's own count or fewer)
    seq_len: int  # prompt + completion tokens per row
    rows: int  # minibatch rows (train.minibatch_size); rows per pass follow micro_batch_size
    options: str  # a key of OPTION_SETS
    # The optimizer. Default: make_optimizer(device="cpu"), torch's for-loop AdamW, what the train
    # stage builds on CPU. adamw_foreach: torch's multi-tensor AdamW (CUDA's default, what the
    # train stage built on CUDA before commit 1aa4279). adamw_fused: make_optimizer(device="cuda"),
    # the fused AdamW the train stage builds on CUDA now, run here on CPU tensors.
    adamw_foreach: bool = False
    adamw_fused: bool = False
    # Run this many consecutive updates on the same batch and measure the last one: 2 is every
    # update of a run after its first (what the previous update leaves allocated is seen).
    updates: int = 1

    @property
    def variant(self) -> str:
        """'' for the default point; otherwise what makes it a variant (foreach, fused, update2)."""
        return "/".join(filter(None, ["foreach" if self.adamw_foreach else "", "fused" if self.adamw_fused else "",
                                      f"update{self.updates}" if self.updates > 1 else ""]))

    @property
    def key(self) -> str:
        return f"{self.model}/L{self.layers}/T{self.seq_len}/B{self.rows}/{self.options}" + (
            "/" + self.variant if self.variant else "")


def _full_layers(model: str) -> int:
    return json.loads((MODELS[model] / "config.json").read_text())["num_hidden_layers"]


def plan(name: str) -> list[Point]:
    """The named measurement plans. ``full`` is what results/memory/memory.json holds; its choice of
    points (and why) is written up in docs/studies/memory.md."""
    if name == "quick":
        return [Point("qwen2.5-0.5b", 1, 256, 2, "all")]
    if name != "full":
        raise ValueError(name)
    small, big, huge = "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"
    P = Point
    mixed = ("baseline", "chunk", "ckpt", "micro1", "ckpt_chunk", "all")  # bf16-mixed full fine-tuning
    # In the order they were measured at commit 1aa4279's code (most needed first). The points
    # marked "re-used" were measured at f0aeb72, before it; docs/studies/memory.md says why its changes
    # cannot move them (no autocast, or only LoRA's few fp32 adapter weights cast) and
    # results/memory/memory.json marks them ``reused_from``. --resume keeps them.
    return [
        # The headline option set (all) at 1k, 0.5B, 2 and 6 layers and the full 24: the check of
        # the extrapolation in depth.
        *(P(small, n, 1024, 2, "all") for n in (2, 6, 24)),
        # Variants: the second of two consecutive updates (what the first leaves allocated), and
        # the step with the fused AdamW (CUDA's optimizer now) and the multi-tensor one (before).
        P(small, 2, 1024, 2, "all", updates=2), P(small, 2, 1024, 2, "all", adamw_fused=True),
        P(small, 2, 1024, 2, "all", adamw_foreach=True),
        # 1.5B bf16-mixed, the fits-table configuration at 2 and 4 layers, 1k and 4k.
        *(P(big, n, T, 2 if T == 1024 else 1, "all") for T in (1024, 4096) for n in (2, 4)),
        # 7B bf16-true with two micro-batches per minibatch at 1k, 1 and 2 layers: the backward of a
        # micro-batch that finds the gradients allocated, measured rather than bounded.
        *(P(huge, n, 1024, 2, "bf16true_all") for n in (1, 2)),
        # 0.5B at 4k, one row per minibatch (so micro-batching is off by itself), and two rows with
        # one per pass (the second micro-batch finds the gradients allocated).
        *(P(small, n, 4096, 1, "all") for n in (2, 6)), P(small, 2, 4096, 2, "all"),
        P(small, 24, 1024, 2, "baseline"),
        # Every option on and off at 1k, 0.5B, 2 and 6 layers (2 rows per minibatch).
        *(P(small, n, 1024, 2, o) for n in (2, 6) for o in mixed if o != "all"),
        *(P(small, n, 1024, 2, o) for n in (2, 6) for o in ("bf16true_all", "lora_all")),  # re-used but L2 lora_all
        P(small, 24, 1024, 2, "lora_all"),  # re-used
        # 0.5B at 4k: options on and off, micro-batching on/off (two rows per pass without and with
        # chunking).
        *(P(small, n, 4096, 1, o) for n in (2, 6) for o in ("chunk",)), P(small, 2, 4096, 2, "ckpt_chunk"),
        *(P(small, 2, 4096, 1, o) for o in ("baseline", "ckpt")),
        # 1.5B: options on and off at 1k, 2 layers.
        *(P(big, 2, 1024, 2, o) for o in ("baseline", "chunk", "ckpt", "micro1")),
        *(P(small, 6, 4096, 1, o) for o in ("baseline", "ckpt")), P(small, 6, 4096, 2, "ckpt_chunk"),
        # Re-used: bf16-true and LoRA at 4k, 1.5B and 7B; the 4k two-row baseline that does not fit.
        *(P(small, n, 4096, 1, o) for n in (2, 6) for o in ("bf16true_all", "lora_all")),
        P(small, 2, 4096, 2, "baseline"),
        *(P(big, 2, 1024, 2, o) for o in ("bf16true_all", "lora_all")),
        *(P(big, 4, 1024, 2, o) for o in ("bf16true_all", "lora_all")),
        *(P(big, n, 4096, 1, o) for n in (2, 4) for o in ("bf16true_all", "lora_all")),
        # 7B width (untied 152k x 3584 embedding and head) at 1 and 2 layers, where the training
        # state fits this machine: LoRA and bf16-true (bf16-mixed needs 16 bytes/parameter, 21 GB
        # at one layer). The 7B bf16-mixed estimate is derived from these (docs/studies/memory.md).
        *(P(huge, n, 1024, 1, o) for n in (1, 2) for o in ("lora_all", "bf16true_all")),
        *(P(huge, 1, 4096, 1, o) for o in ("lora_all", "bf16true_all")),  # 2 layers at 4k: 10 min each
    ]


# --------------------------------------------------------------------------- the child process


def _sdpa_kernels(model, autocast) -> list[str]:
    """The aten attention kernels a short forward of ``model`` runs (after the measurement)."""
    import torch
    from torch.profiler import profile

    ids = torch.randint(0, 1000, (1, 32))
    with torch.no_grad(), autocast(), profile() as prof:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return sorted({e.name for e in prof.events() if "attention" in e.name and e.name.startswith("aten::_")})


def measure(point: Point, record: dict, seed: int = 0) -> None:
    """Build, set up and update one configuration in this process, filling ``record`` as it goes
    (so a failure still says how far it got)."""
    import functools
    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # the model is prepared, scored and stepped as the train stage does it (bench/measure.py says
    # why one update reaches into rredcot_cli.train)
    from rredcot_cli.train import trainable
    from rredcot_cli.train.precision import GradientStepper, resolve_precision
    from rredcot_cli.policy.logprobs import ForwardPass

    import peft  # noqa: F401 - imported up front so rss_imports includes it for every point

    opts = OPTION_SETS[point.options]
    record.update(stage="imports", rss_imports=proc_status("VmRSS"))
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(MODELS[point.model])
    config.num_hidden_layers = point.layers
    record["stage"] = "build"
    model = AutoModelForCausalLM.from_config(config)
    record["attn_implementation"] = model.config._attn_implementation
    precision = resolve_precision(opts.precision, "bfloat16")  # the shipped Qwen configs are bfloat16
    lora = (trainable.LoraSettings(r=opts.lora_r, alpha=LORA_ALPHA, dropout=0.0, target_modules=("all-linear",))
            if opts.lora_r else None)
    model = trainable.prepare(model, precision, gradient_checkpointing=opts.gradient_checkpointing, lora=lora)
    autocast = functools.partial(precision.autocast, "cpu")
    forward = ForwardPass(chunk_tokens=opts.logprob_chunk_tokens, micro_batch_size=opts.micro_batch_size,
                          autocast=autocast)
    phases = PhaseMeter()
    stepper = metered_stepper(phases, GradientStepper, record)(precision, "cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    # make_optimizer(device="cuda") is the fused AdamW the train stage builds on CUDA, here on CPU tensors
    optimizer, scheduler = optimizer_as_trained(model, 1e-6, "cuda" if point.adamw_fused else "cpu",
                                                foreach=point.adamw_foreach)
    record["optimizer"] = {k: optimizer.defaults.get(k) for k in ("foreach", "fused")}
    record["stage"] = "setup"
    prime_moments(optimizer, params)
    param_bytes, optimizer_state_bytes = state_bytes(model, optimizer)
    record.update(
        params_total=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        params_trainable=sum(p.numel() for p in params), param_bytes=param_bytes,
        optimizer_state_bytes=optimizer_state_bytes,
        rss_setup=proc_status("VmRSS"), vm_setup=proc_status("VmSize"), peak_setup=proc_status("VmHWM"),
        checkpointing_active=trainable.checkpointing_active(model))

    gen = torch.Generator().manual_seed(seed)
    completion = point.seq_len - PROMPT_TOKENS
    prompt_ids = torch.randint(0, PAD_ID, (point.rows, PROMPT_TOKENS), generator=gen).tolist()
    completion_ids = torch.randint(0, PAD_ID, (point.rows, completion), generator=gen).tolist()
    advantages = torch.randn(point.rows, completion, generator=gen)
    record["rows_per_pass"] = forward.rows_per_pass(point.rows)

    batch = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "advantages": advantages, "pad_id": PAD_ID,
             "max_tokens": completion}

    def update():
        return one_update(model, optimizer, scheduler, batch, forward, stepper, torch.Generator().manual_seed(seed))

    for i in range(point.updates - 1):  # earlier updates of a run, not measured
        record["stage"] = f"update {i + 1} (not measured)"
        update()
        gc.collect()
    record["rss_before_update"] = proc_status("VmRSS")
    record["hwm_reset"] = reset_peak_rss()
    record["stage"] = "update"
    phases.peaks.clear()
    started = time.perf_counter()
    stats = update()
    seconds = time.perf_counter() - started
    phases.mark("other")
    record.update(update_seconds=seconds, peak_update=max(phases.peaks.values()), phase_peaks=phases.peaks,
                  rss_after=proc_status("VmRSS"), updates_taken=stats.updates, loss=stats.loss,
                  # after the update: 0 since 1aa4279 (policy_update frees them); G at the step is
                  # grad_bytes_at_step
                  grad_bytes=sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None))
    record["stage"] = "done"
    record["sdpa_kernels"] = _sdpa_kernels(model, autocast)


def _child_main(point_json: str, result_path: str, cap_bytes: int) -> None:
    import resource

    try:  # if the machine runs out of memory anyway, the kernel kills this process, not a neighbour
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass
    if cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))
    point = Point(**json.loads(point_json))
    record: dict = {}
    try:
        measure(point, record)
        record["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 - any failure is a result to record
        import traceback

        text = f"{type(e).__name__}: {e}"
        oom = isinstance(e, MemoryError) or "can't allocate memory" in text or "std::bad_alloc" in text
        record.update(status="does_not_fit" if oom else "error", error=text[:500],
                      traceback=traceback.format_exc()[-2000:])
    Path(result_path).write_text(json.dumps(record))


# --------------------------------------------------------------------------- the parent


def machine_info(cap_bytes: int) -> dict:
    import peft
    import torch
    import transformers

    return {"cpu": cpuinfo().get("model name", platform.processor()), "cores": os.cpu_count(),
            "mem_total_bytes": mem_total_bytes(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "transformers": transformers.__version__,
            "peft": peft.__version__, "address_space_cap_bytes": cap_bytes, "malloc_env": MALLOC_ENV}


def run_point(point: Point, cap_bytes: int, timeout_s: float) -> dict:
    """One point in a fresh child process; the record plus wait4's peak RSS and exit status."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(dataclasses.asdict(point)),
           "--child-result", str(result), "--cap-bytes", str(cap_bytes)]
    env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    deadline = started + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.5)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait on it again
    record = json.loads(result.read_text()) if result.stat().st_size else {}
    result.unlink()
    if not record:
        record = {"status": "timeout" if time.perf_counter() > deadline else "killed",  # e.g. the OOM killer
                  "error": f"child exit status {proc.returncode} (a negative value is the signal)"}
    opts = OPTION_SETS[point.options]
    return {**dataclasses.asdict(point), "key": point.key, "full_layers": _full_layers(point.model),
            "prompt_tokens": PROMPT_TOKENS, "completion_tokens": point.seq_len - PROMPT_TOKENS,
            "option_values": dataclasses.asdict(opts), **record,
            # wait4's ru_maxrss counts from the child's last VmHWM reset (the update's end), not from its start
            "ru_maxrss_after_update": usage.ru_maxrss * 1024, "wall_seconds": time.perf_counter() - started,
            "exit_code": proc.returncode}


def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f}"


def run_plan(points: list[Point], out: Path | None, cap_bytes: int, timeout_s: float, resume: bool) -> dict:
    data = {"machine": machine_info(cap_bytes), "command": " ".join(["python"] + [shlex.quote(a) for a in sys.argv]),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "points": []}
    if resume and out is not None and out.is_file():
        old = json.loads(out.read_text())
        data["points"] = [p for p in old["points"] if p.get("status") in ("ok", "does_not_fit")]
        data["earlier_runs"] = old.get("earlier_runs", []) + [{k: old[k] for k in ("command", "started") if k in old}]
    done = {p["key"] for p in data["points"]}
    todo = [p for p in points if p.key not in done]
    print(f"{len(todo)} points to measure" + (f" ({len(points) - len(todo)} already in {out})" if resume else ""),
          flush=True)
    for i, point in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {point.key} ...", flush=True)
        rec = run_point(point, cap_bytes, timeout_s)
        data["points"].append(rec)
        print(f"    {rec['status']}: setup {_mb(rec.get('rss_setup'))} MiB, update peak {_mb(rec.get('peak_update'))} "
              f"MiB, rows/pass {rec.get('rows_per_pass', '-')}, {rec['wall_seconds']:.0f} s"
              + (f"  ({rec.get('error', '')[:160]})" if rec["status"] != "ok" else ""), flush=True)
        _write(data, out)
    _write(data, out)
    return data


def _write(data: dict, out: Path | None) -> None:
    # every kept point, earlier runs' too; points carried over from an older measurement file
    # (``reused_from``) are counted apart
    data["seconds"] = sum(r["wall_seconds"] for r in data["points"] if "reused_from" not in r)
    data["seconds_reused"] = sum(r["wall_seconds"] for r in data["points"] if "reused_from" in r)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Peak memory of one rredcot policy update at Qwen2.5 shapes, options on and off "
                    "(each point in a fresh, address-space-capped subprocess).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="option sets (train.precision, gradient_checkpointing, logprob_chunk_tokens, micro_batch_size, "
               "model.lora.r):\n" + "\n".join(
                   f"  {k:13} {v.precision:10} ckpt={'on ' if v.gradient_checkpointing else 'off'} "
                   f"chunk={v.logprob_chunk_tokens:<5} micro={v.micro_batch_size} lora_r={v.lora_r}"
                   for k, v in OPTION_SETS.items()))
    parser.add_argument("--quick", action="store_true",
                        help="one small point (0.5B, 1 layer, 256 tokens): a smoke check under a minute")
    parser.add_argument("--plan", choices=["full"], help="a named set of points (see plan())")
    parser.add_argument("--models",
                        help=f"comma-separated, from {', '.join(MODELS)} (with --lengths/--options/--layers)")
    parser.add_argument("--lengths", default="1024", help="comma-separated prompt+completion lengths (default 1024)")
    parser.add_argument("--options", default="baseline,all",
                        help=f"comma-separated option sets, from {', '.join(OPTION_SETS)}")
    parser.add_argument("--layers", default="2", help="comma-separated decoder depths; 0 = the config's own")
    parser.add_argument("--rows", type=int, default=2, help="minibatch rows (default 2)")
    parser.add_argument("--adamw-foreach", action="store_true",
                        help="torch's multi-tensor AdamW (CUDA's default; the train stage's CUDA optimizer before 1aa4279)")
    parser.add_argument("--adamw-fused", action="store_true",
                        help="the fused AdamW make_optimizer builds for CUDA, on CPU tensors")
    parser.add_argument("--updates", type=int, default=1,
                        help="consecutive updates per point; the last one is measured (default 1)")
    parser.add_argument("--out", type=Path, help="JSON to write (rewritten after every point)")
    parser.add_argument("--resume", action="store_true", help="keep the finished points already in --out")
    parser.add_argument("--cap-gb", type=float, default=20.0, help="address-space cap per child in GiB (default 20)")
    parser.add_argument("--timeout-min", type=float, default=45.0, help="per-point time limit in minutes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-result", help=argparse.SUPPRESS)
    parser.add_argument("--cap-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        _child_main(args.child, args.child_result, args.cap_bytes)
        return
    if args.quick:
        points = plan("quick")
    elif args.plan:
        points = plan(args.plan)
    elif args.models:
        models, option_sets = args.models.split(","), args.options.split(",")
        unknown = (set(models) - set(MODELS)) | (set(option_sets) - set(OPTION_SETS))
        if unknown:
            parser.error(f"unknown model or option set: {', '.join(sorted(unknown))}")
        points = [Point(m, int(n) or _full_layers(m), int(t), args.rows, o, args.adamw_foreach, args.adamw_fused,
                        args.updates)
                  for m in models for t in args.lengths.split(",") for o in option_sets for n in args.layers.split(",")]
    else:
        parser.error("say what to measure: --quick, --plan or --models")
    run_plan(points, args.out, int(args.cap_gb * 2**30), args.timeout_min * 60, args.resume)


if __name__ == "__main__":
    main()
