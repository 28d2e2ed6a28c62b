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
    python bench/memory.py --derive results/memory/memory.json  # fits-on tables (docs/studies/memory.md)

``--derive`` turns the measurements into whole-model, GPU-side estimates (docs/studies/memory.md says
how) and writes them beside the input as memory_derived.json.
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
                     prime_moments, proc_status, reset_peak_rss)

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
    unique = {id(p): p for p in model.parameters()}.values()
    record.update(
        params_total=sum(p.numel() for p in unique), params_trainable=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in unique),
        optimizer_state_bytes=sum(t.numel() * t.element_size() for s in optimizer.state.values()
                                  for t in s.values() if torch.is_tensor(t)),
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


# --------------------------------------------------------------------------- derivation
#
# Everything below turns results/memory/memory.json into whole-model, GPU-side estimates. Bytes of
# parameters, gradients and AdamW moments are exact arithmetic from config.json; the rest of an
# update's memory comes from the measured per-phase peaks, extrapolated linearly in depth (each
# phase's extra memory per decoder layer is constant; checked at 0.5B's full 24 layers).

MIB, GIB = 2**20, 2**30
PHASES = ("prepass", "forward", "backward", "step", "other")
# Usable memory of a representative card of each size (nvidia-smi's total).
ACCELERATORS = {"24 GB": 23_034 * MIB, "40 GB": 40_960 * MIB, "80 GB": 81_559 * MIB, "141 GB": 143_771 * MIB}
ACCELERATOR_CARDS = {"24 GB": "L4", "40 GB": "A100-40GB", "80 GB": "H100-80GB", "141 GB": "H200"}
# GPU-side assumptions (not measured here; docs/studies/memory.md says why these values):
CUDA_CONTEXT = 1.0 * GIB  # CUDA context + cuBLAS workspaces of the one process (vLLM in-process, TP=1)
ENGINE_WORKSPACE = 1.5 * GIB  # vLLM awake, beyond weights and KV cache: activations, CUDA graphs, sampler
ENGINE_ASLEEP = 1.0 * GIB  # what LLM.sleep(level=2) leaves: graph pools, allocator residue
KV_SEQUENCES = 64  # KV cache budget: this many sequences of the full length resident at once
TABLE_OPTIONS = {"all": "full FT, bf16-mixed", "bf16true_all": "full FT, bf16-true", "lora_all": "LoRA r=16"}


@dataclass(frozen=True)
class Arch:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, model: str) -> "Arch":
        c = json.loads((MODELS[model] / "config.json").read_text())
        return cls(c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                   c["num_key_value_heads"], c["vocab_size"], bool(c.get("tie_word_embeddings", False)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_shapes(self) -> list[tuple[int, int, bool]]:
        """(in, out, bias) of each Linear of one decoder layer."""
        H, q, kv, I = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(H, q, True), (H, kv, True), (H, kv, True), (q, H, False), (H, I, False), (H, I, False), (I, H,
                 False)]

    def counts(self, layers: int, lora_r: int = 0) -> dict:
        linear = sum(i * o + (o if b else 0) for i, o, b in self.linear_shapes())
        layer = linear + 2 * self.hidden  # + two RMSNorms
        embed = self.vocab * self.hidden
        head = 0 if self.tied else embed
        return {"total": embed + head + layers * layer + self.hidden, "layer": layer, "embed": embed, "head": head,
                # weights autocast casts to bf16 (and caches while the autocast context is open): every
                # Linear, the LM head included (tied or not); the embedding lookup is not cast
                "cast": layers * linear + embed,
                "lora": layers * sum(lora_r * (i + o) for i, o, _ in self.linear_shapes())}

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


def state_bytes(model: str, layers: int, options: str) -> dict:
    """Exact bytes of weights (W), gradients (G), AdamW moments (M) and the multi-tensor AdamW's
    step temporary (T: a copy of the second moments; CUDA's optimizer before 1aa4279, now fused
    and without it) for ``layers`` decoder layers."""
    opts = OPTION_SETS[options]
    n = Arch.of(model).counts(layers, opts.lora_r)
    if opts.lora_r:  # frozen base in bf16, adapters in fp32 (bf16-mixed)
        W, trained, width = 2 * n["total"] + 4 * n["lora"], n["lora"], 4
    else:
        width = 2 if opts.precision == "bf16-true" else 4
        W, trained = width * n["total"], n["total"]
    return {"W": W, "G": width * trained, "M": 2 * width * trained, "T": width * trained, "params": n}


def _variant(p: dict) -> str:
    """'' for a default point; else what makes it a variant (foreach, fused, update2). Points
    re-used from the measurement before 1aa4279 carry ``steady: false`` and none of the new fields."""
    return "/".join(filter(None, ["foreach" if p.get("adamw_foreach") else "",
                    "fused" if p.get("adamw_fused") else "",
                                  f"update{p['updates']}" if p.get("updates", 1) > 1 else "",
                                  "steady" if p.get("steady") else ""]))


def _ok(p: dict) -> bool:
    """A default point (no variant) that finished."""
    return p["status"] == "ok" and not _variant(p)


def _grads(p: dict) -> int:
    """G as measured: the gradient bytes allocated when the step begins (recorded since 1aa4279,
    after which policy_update frees them at its end); for re-used points, those left after it."""
    return p["grad_bytes_at_step"] if "grad_bytes_at_step" in p else p["grad_bytes"]


def _residuals(p: dict) -> dict:
    """Extra bytes of each phase above W + M. Since 1aa4279 policy_update frees the gradients at
    its end, so every update of a run starts from W + M, as the points do: these are the steady
    state's residuals as measured (checked by the ``updates=2`` variant). Phases that hold the
    gradients include them: the step and ``other`` all of G, a later micro-batch's forward and
    backward all of G, a single micro-batch's backward those allocated so far."""
    return {k: p["phase_peaks"][k] - p["rss_setup"] for k in PHASES}


def _fit(points: list[dict], layers: int, values) -> dict:
    """Per-phase values at ``layers`` decoder layers: linear through the two shallowest points."""
    a, b = sorted(points, key=lambda p: p["layers"])[:2]
    va, vb = values(a), values(b)
    return {k: va[k] + (layers - a["layers"]) * (vb[k] - va[k]) / (b["layers"] - a["layers"]) for k in va}


def _groups(points: list[dict]) -> dict:
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        if p["status"] == "ok":
            key = (p["model"], p["seq_len"], p["rows"], p["options"], _variant(p))
            groups.setdefault(key, []).append(p)
    return groups


def _mixed_from_true(R_true: dict, model: str, layers: int, rows_per_pass: int, seq_len: int, several: bool) -> dict:
    """bf16-mixed residuals from bf16-true ones (7B, where bf16-mixed does not fit this machine).
    Without autocast's weight cache (1aa4279) the pre-pass is the same. Otherwise bf16-mixed has
    fp32 gradients (+2 bytes per parameter, dG, wherever the gradients are held: the step,
    ``other``, and with several micro-batches a later one's forward and backward), fp32
    checkpointed layer inputs (+2 bytes per hidden value, per layer and one more), and in the
    backward an extra 2 bytes per LM-head weight (its cast, recomputed per chunk). With one
    micro-batch per minibatch the backward holds only part of G at its peak; adding all of dG is
    an upper bound there (``mixed_from_true_checks``)."""
    arch = Arch.of(model)
    n = arch.counts(layers)
    dG = 2 * n["total"]
    ck = (layers + 1) * rows_per_pass * seq_len * arch.hidden * 2
    head = 2 * arch.vocab * arch.hidden
    extra = {"prepass": 0, "forward": ck + (dG if several else 0), "backward": ck + dG + head,
             # CPU's for-loop AdamW step: G plus two temporaries of the largest parameter, twice as
             # wide in fp32; the GPU estimate replaces the step anyway
             "step": R_true["step"], "other": dG}
    return {k: R_true[k] + extra[k] for k in R_true}


def _checkpoint_input_bytes(p: dict) -> int:
    """Bytes per decoder layer that gradient checkpointing keeps for one pass of ``p``: the
    layer's input, float32 under autocast (the residual stream stays in the weights' dtype),
    bf16 with bf16 weights (bf16-true; LoRA's frozen base)."""
    opts = OPTION_SETS[p["options"]]
    width = 4 if opts.precision == "bf16-mixed" and not opts.lora_r else 2
    return p["rows_per_pass"] * p["seq_len"] * Arch.of(p["model"]).hidden * width


def _fit_other_length(points: list[dict], p: dict, layers: int) -> tuple[dict, str]:
    """Residuals at ``layers`` for a configuration measured at one depth only: the slope per layer
    of the same model and options at another length (the same minibatch rows where measured), plus
    the difference in what checkpointing keeps per layer (forward and backward; the pre-pass keeps
    nothing per layer). Only for gradient-checkpointed configurations, where that is the whole
    token-dependent part of the slope (checked on 0.5B and 1.5B in ``length_checks``)."""
    assert OPTION_SETS[p["options"]].gradient_checkpointing
    same = [q for q in points if _ok(q) and q["model"] == p["model"] and q["options"] == p["options"]
            and q["seq_len"] != p["seq_len"]]
    by_rows: dict[int, dict] = {}
    for q in same:
        by_rows.setdefault(q["rows"], {})[q["layers"]] = q
    other = by_rows.get(p["rows"]) if len(by_rows.get(p["rows"], {})) >= 2 else next(
        (v for _, v in sorted(by_rows.items()) if len(v) >= 2), None)
    if not other:
        raise LookupError(f"{p['key']}: no other length measured at two depths")
    a, b = (other[d] for d in sorted(other)[:2])

    def without_grads(q: dict) -> dict:
        # With several micro-batches a later one's forward and backward hold all of G, which grows
        # by G per layer: taken out here and put back at the target depth, so that a slope can
        # move between a minibatch of one micro-batch and one of several.
        R = _residuals(q)
        if q["rows_per_pass"] < q["rows"]:
            R = {k: v - (_grads(q) if k in ("forward", "backward") else 0) for k, v in R.items()}
        return R

    ra, rb = without_grads(a), without_grads(b)
    extra = _checkpoint_input_bytes(p) - _checkpoint_input_bytes(a)
    slope = {k: (rb[k] - ra[k]) / (b["layers"] - a["layers"]) + (extra if k in ("forward", "backward") else 0)
             for k in PHASES}
    base = without_grads(p)
    G = state_bytes(p["model"], layers, p["options"])["G"] if p["rows_per_pass"] < p["rows"] else 0
    return ({k: base[k] + (layers - p["layers"]) * slope[k] + (G if k in ("forward", "backward") else 0)
             for k in PHASES},
            f"slope from {a['seq_len']} tokens, {a['rows']} row(s) + checkpointed layer inputs")


def _length_checks(points: list[dict]) -> list[dict]:
    """``_fit_other_length`` where both lengths are measured at two depths: predicted vs measured
    residuals at the deeper point."""
    checks = []
    groups = _groups(points)
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant or not OPTION_SETS[options].gradient_checkpointing or len(ps) < 2:
            continue
        if not any(k[0] == model and k[3] == options and k[1] != T and len(v) >= 2 and not k[4]
                   for k, v in groups.items()):
            continue
        a, b = sorted(ps, key=lambda p: p["layers"])[:2]
        pred, how = _fit_other_length(points, a, b["layers"])
        checks.append({"key": b["key"], "from": a["key"], "how": how, "predicted": pred, "measured": _residuals(b)})
    return checks


# The minibatch of the GPU tables: 2 rows at 1k (two micro-batches of one row) and 1 row at 4k.
# Where a model was measured only with another row count (7B LoRA at 1k: 1 row) that is used
# and the row says so.
TABLE_ROWS = {1024: 2, 4096: 1}


def derive(path: Path) -> dict:
    data = json.loads(path.read_text())
    points = data["points"]
    groups = _groups(points)
    out: dict = {"source": str(path), "assumptions": {
        "accelerators_bytes": ACCELERATORS, "cards": ACCELERATOR_CARDS, "cuda_context": CUDA_CONTEXT,
        "engine_workspace": ENGINE_WORKSPACE, "engine_asleep": ENGINE_ASLEEP, "kv_sequences": KV_SEQUENCES,
        "table_rows": TABLE_ROWS}}

    # 1. Static state: arithmetic against what the model and AdamW hold, and against RSS.
    static = []
    for p in points:
        if p["status"] != "ok":
            continue
        st = state_bytes(p["model"], p["layers"], p["options"])
        static.append({"key": p["key"], "params": p["params_total"], "params_arith": st["params"]["total"]
                       + (st["params"]["lora"] if OPTION_SETS[p["options"]].lora_r else 0),
                       "W_M_arith": st["W"] + st["M"], "W_M_tensors": p["param_bytes"] + p["optimizer_state_bytes"],
                       "rss_setup_above_imports": p["rss_setup"] - p["rss_imports"],
                       "G_arith": st["G"], "G_tensors": _grads(p),
                       "G_after_update": p["grad_bytes"], "reused_from": p.get("reused_from")})
    out["static"] = static

    # 2. Depth: the two shallowest depths predict every deeper measured one.
    checks = []
    for key, ps in groups.items():
        if len(ps) < 3:
            continue
        for q in sorted(ps, key=lambda p: p["layers"])[2:]:
            pred = _fit(ps, q["layers"], _residuals)
            meas = _residuals(q)
            checks.append({"key": q["key"], "predicted": pred, "measured": meas,
                           "peak_predicted": max(pred.values()), "peak_measured": max(meas.values())})
    out["depth_checks"] = checks

    # 3. Full depth on this CPU (what the points measure): W + M + max phase extra.
    full = []
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant:
            continue
        L = Arch.of(model).layers
        byd = {p["layers"]: p for p in ps}
        st = state_bytes(model, L, options)
        row = {"model": model, "seq_len": T, "rows": rows, "options": options,
               "rows_per_pass": ps[0]["rows_per_pass"], "measured_depths": sorted(byd),
               "measured_peak_above_imports": {d: byd[d]["peak_update"] - byd[d]["rss_imports"] for d in sorted(byd)},
               "reused_from": sorted({p["reused_from"] for p in ps if p.get("reused_from")})}
        if L in byd:
            row["full_depth_peak"] = byd[L]["peak_update"] - byd[L]["rss_imports"]
            row["full_depth_source"] = "measured"
        elif len(byd) >= 2:
            E = _fit(ps, L, _residuals)
            row["full_depth_peak"] = st["W"] + st["M"] + max(E.values())
            row["full_depth_source"] = "extrapolated"
        full.append(row)
    out["full_depth_cpu"] = full

    # 4. Checks of the arithmetic the GPU estimates add to the measurements.
    # The optimizers: the step's extra with the fused AdamW (CUDA's since 1aa4279) and the
    # multi-tensor one (CUDA's before), against the for-loop default of the same point.
    optimizers = []
    for p in points:
        if p["status"] == "ok" and (p.get("adamw_foreach") or p.get("adamw_fused")) and p.get("updates", 1) == 1:
            st = state_bytes(p["model"], p["layers"], p["options"])
            twin = next(q for q in points if _ok(q) and q["key"] == p["key"].rsplit("/", 1)[0])
            optimizers.append({"key": p["key"], "optimizer": "fused" if p.get("adamw_fused") else "foreach",
                               "step_extra": p["phase_peaks"]["step"] - p["rss_setup"],
                               "step_extra_forloop": twin["phase_peaks"]["step"] - twin["rss_setup"],
                               "G": _grads(p), "T_arith": st["T"],
                               "beyond_G": p["phase_peaks"]["step"] - p["rss_setup"] - _grads(p),
                               "beyond_G_plus_T": p["phase_peaks"]["step"] - p["rss_setup"] - _grads(p) - st["T"]})
    out["optimizer_checks"] = optimizers
    # The steady state: the second of two consecutive updates against the first (same point).
    second = []
    for p in points:
        if p["status"] == "ok" and p.get("updates", 1) > 1 and not (p.get("adamw_foreach") or p.get("adamw_fused")):
            twin = next(q for q in points if _ok(q) and q["key"] == p["key"].rsplit("/", 1)[0])
            second.append({"key": p["key"], "from": twin["key"], "first_update": _residuals(twin),
                           "later_update": _residuals(p), "rss_before_update_above_setup":
                           p.get("rss_before_update", p["rss_setup"]) - p["rss_setup"],
                           "grads_after_update": p["grad_bytes"]})
    out["steady_checks"] = second
    # A second micro-batch: the same minibatch size per pass (one row), two rows against one.
    micro = []
    for (model, T, rows, options, variant), ps in sorted(groups.items()):
        if variant or rows < 2 or ps[0]["rows_per_pass"] != 1:
            continue
        for p in ps:
            q = next((q for q in groups.get((model, T, 1, options, ""), []) if q["layers"] == p["layers"]), None)
            if q is not None:
                micro.append({"key": p["key"], "vs": q["key"], "G": _grads(p), "two_micro_batches": _residuals(p),
                              "one": _residuals(q)})
    out["micro_batch_checks"] = micro
    mixed = []
    for (model, T, rows, options, variant), ps in groups.items():
        if options != "all" or variant:
            continue
        for p in ps:
            t = next((q for q in groups.get((model, T, rows, "bf16true_all", ""), []) if q["layers"] == p["layers"]),
                     None)
            if t is not None:
                several = p["rows_per_pass"] < p["rows"]
                mixed.append({"key": p["key"], "several_micro_batches": several, "measured": _residuals(p),
                              "predicted": _mixed_from_true(_residuals(t), model, p["layers"], p["rows_per_pass"], T,
                                                            several)})
    out["mixed_from_true_checks"] = mixed
    out["length_checks"] = _length_checks(points)
    # What a second row per pass costs: ckpt_chunk (the minibatch in one pass) against all (one
    # row per pass), same model, length and depth.
    rows_ = []
    for p in points:
        if _ok(p) and p["options"] == "ckpt_chunk" and p["rows_per_pass"] == 2:
            q = next((q for q in points if _ok(q) and q["options"] == "all" and q["rows_per_pass"] == 1 and
                      (q["model"], q["seq_len"], q["layers"]) == (p["model"], p["seq_len"], p["layers"])), None)
            if q is not None:
                rp, rq = _residuals(p), _residuals(q)
                rows_.append({"key": p["key"], "vs": q["key"], "two_rows": rp, "one_row": rq,
                              "peak_difference": max(rp.values()) - max(rq.values())})
    out["row_checks"] = rows_
    # The GPU step: G plus what the optimizer adds beyond it (measured on this CPU: fused AdamW,
    # CUDA's now; the multi-tensor one, before 1aa4279, beyond G + T).
    eps_fused = max((o["beyond_G"] for o in optimizers if o["optimizer"] == "fused"), default=0)
    eps_foreach = max((o["beyond_G_plus_T"] for o in optimizers if o["optimizer"] == "foreach"), default=0)
    out["step_beyond_G"] = {"fused": eps_fused, "foreach_beyond_T": eps_foreach}

    # 5. GPU estimates at full depth, steady state, with vLLM colocated.
    gpu = []
    for model in MODELS:
        arch = Arch.of(model)
        L = arch.layers
        for T in sorted({p["seq_len"] for p in points}):
            for options, label in TABLE_OPTIONS.items():
                source, from_true = options, False

                def measured(opts: str, length: int | None = T) -> list[dict]:
                    return [p for p in points if _ok(p) and p["model"] == model and p["options"] == opts
                            and length in (None, p["seq_len"])]

                ps = measured(options)
                if options == "all" and not measured("all", None):  # 7B: bf16-mixed does not fit this machine
                    ps = measured("bf16true_all")
                    source, from_true = "bf16true_all + bf16-mixed arithmetic", True
                if not ps:
                    continue
                want = TABLE_ROWS.get(T, 1)
                rows = want if any(p["rows"] == want for p in ps) else max(p["rows"] for p in ps)
                if rows != want:
                    source += f"; {rows}-row minibatch (no {want}-row point)"
                by_layers = {p["layers"]: p for p in ps if p["rows"] == rows}
                pair = [by_layers[d] for d in sorted(by_layers)[:2]]
                if len(pair) == 2:
                    R = _fit(pair, L, _residuals)
                else:  # one depth at this length (7B at 4k): the per-layer slope from another length
                    try:
                        R, how = _fit_other_length(points, pair[0], L)
                    except LookupError:
                        continue
                    source += f"; {how}"
                several = pair[0]["rows_per_pass"] < pair[0]["rows"]
                if from_true:
                    R = _mixed_from_true(R, model, L, pair[0]["rows_per_pass"], T, several)
                st = state_bytes(model, L, options)
                R_gpu = dict(R, step=st["G"] + eps_fused)  # the fused AdamW make_optimizer builds on CUDA
                phase = max(R_gpu, key=R_gpu.get)
                runner_up = max((k for k in R_gpu if k != phase), key=R_gpu.get)
                resting = st["W"] + st["M"]  # gradients freed after each update (1aa4279)
                peak = resting + R_gpu[phase]
                n_total = arch.counts(L)["total"]
                kv = KV_SEQUENCES * T * arch.kv_bytes_per_token()
                awake = 2 * n_total + kv + ENGINE_WORKSPACE
                need_sleep = max(CUDA_CONTEXT + peak + ENGINE_ASLEEP, CUDA_CONTEXT + resting + awake)
                need_awake = CUDA_CONTEXT + peak + awake
                # Were the step still torch's multi-tensor AdamW (CUDA's default, the optimizer
                # before 1aa4279): that finding's share of the change, the other two fixes kept.
                R_fe = dict(R, step=st["G"] + st["T"] + eps_foreach)
                peak_fe = resting + max(R_fe.values())
                need_fe = max(CUDA_CONTEXT + peak_fe + ENGINE_ASLEEP, CUDA_CONTEXT + resting + awake)
                gpu.append({"model": model, "seq_len": T, "options": options, "label": label, "source": source,
                            "rows": rows, "rows_per_pass": pair[0]["rows_per_pass"],
                            "depths_used": [p["layers"] for p in pair], "several_micro_batches": several,
                            "W": st["W"], "G": st["G"], "M": st["M"], "T": st["T"], "residual": R_gpu,
                            "peak_phase": phase, "runner_up_phase": runner_up,
                            "backward_upper_bound": from_true and not several,
                            "trainer_resting": resting, "trainer_peak": peak,
                            "engine_weights": 2 * n_total, "engine_kv": kv, "engine_awake": awake,
                            "need_sleep_mode": need_sleep, "need_no_sleep": need_awake,
                            "what_if_foreach_adamw": {"trainer_peak": peak_fe, "need_sleep_mode": need_fe,
                                                      "fits": {g: _verdict(need_fe, c) for g,
                                                                           c in ACCELERATORS.items()}},
                            "fits_sleep_mode": {g: _verdict(need_sleep, c) for g, c in ACCELERATORS.items()},
                            "fits_no_sleep": {g: _verdict(need_awake, c) for g, c in ACCELERATORS.items()}})
    out["gpu"] = gpu
    target = path.with_name(path.stem + "_derived.json")
    target.write_text(json.dumps(out, indent=1) + "\n")
    print(report(out))
    print(f"\nwrote {target}")
    return out


def _verdict(need: float, capacity: float) -> str:
    return "yes" if need <= 0.9 * capacity else "tight" if need <= capacity else "no"


def _phase_cell(r: dict) -> str:
    """The peak phase and its residual, with the runner-up; a 7B bf16-mixed backward derived from a
    one-micro-batch minibatch is an upper bound, marked <=."""
    ph, R, ru = r["peak_phase"], r["residual"], r["runner_up_phase"]
    mark = "<=" if ph == "backward" and r["backward_upper_bound"] else "+"
    return f"{ph} {mark}{_g(R[ph])} ({ru} +{_g(R[ru])})"


def _g(x: float) -> str:
    return f"{x / GIB:.1f}"


def report(d: dict) -> str:
    """The derived tables as markdown (docs/studies/memory.md quotes them)."""
    lines = ["### Static state: arithmetic vs measured (MiB; one row per model, depth and options)", "",
             "| model/depth/options | params | W+M arithmetic | W+M tensors | RSS setup - imports | G arithmetic | G tensors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    seen = set()
    for s in d["static"]:
        model, depth, _, _, options = s["key"].split("/")[:5]
        if (model, depth, options) in seen:
            continue
        seen.add((model, depth, options))
        lines.append(f"| {model}/{depth}/{options} | {s['params']:,} | {s['W_M_arith'] / MIB:,.0f} | "
                     f"{s['W_M_tensors'] / MIB:,.0f} | {s['rss_setup_above_imports'] / MIB:,.0f} | "
                     f"{s['G_arith'] / MIB:,.0f} | {s['G_tensors'] / MIB:,.0f} |")
    worst = max(d["static"], key=lambda s: abs(s["rss_setup_above_imports"] - s["W_M_arith"]))
    lines += ["", f"Largest gap between RSS and the arithmetic over all {len(d['static'])} points: "
              f"{(worst['rss_setup_above_imports'] - worst['W_M_arith']) / MIB:+,.0f} MiB ({worst['key']}); "
              f"params arithmetic = counted in every point: {all(s['params'] == s['params_arith'] for s in d['static'])}."]
    lines += ["", "### Depth extrapolation checks (extra above W+M per phase, MiB: predicted from the two "
              "shallowest depths / measured)", "", "| point | " + " | ".join(PHASES) + " | peak |",
              "| --- |" + " ---: |" * (len(PHASES) + 1)]
    for c in d["depth_checks"]:
        cells = [f"{c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES]
        lines.append(f"| {c['key']} | " + " | ".join(cells)
                     + f" | {c['peak_predicted'] / MIB:,.0f} / {c['peak_measured'] / MIB:,.0f} |")
    lines += ["", "### Full depth on this CPU, one update from W+M (GiB above the process floor)", "",
              "| model | tokens | options | rows/pass | measured (depth: GiB) | full depth |",
              "| --- | ---: | --- | ---: | --- | ---: |"]
    for r in d["full_depth_cpu"]:
        meas = ", ".join(f"{k}: {_g(v)}" for k, v in r["measured_peak_above_imports"].items())
        fd = f"{_g(r['full_depth_peak'])} ({r['full_depth_source']})" if "full_depth_peak" in r else "-"
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['options']} (B={r['rows']}) | {r['rows_per_pass']} | {meas} | {fd} |")
    lines += ["", "### Arithmetic checks (MiB)", ""]
    for f in d["optimizer_checks"]:
        lines.append(f"- {f['key']}: step extra {f['step_extra'] / MIB:,.0f} with the {f['optimizer']} AdamW, "
                     f"{f['step_extra_forloop'] / MIB:,.0f} with the for-loop one; G {f['G'] / MIB:,.0f}, "
                     f"T arithmetic {f['T_arith'] / MIB:,.0f}; beyond G {f['beyond_G'] / MIB:,.0f}, "
                     f"beyond G + T {f['beyond_G_plus_T'] / MIB:,.0f}")
    for c in d["steady_checks"]:
        cells = ", ".join(f"{k} {c['first_update'][k] / MIB:,.0f} / {c['later_update'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- steady state: {c['key']} (first update / last update, extra above W+M): {cells}; "
                     f"RSS before the last update {c['rss_before_update_above_setup'] / MIB:+,.0f} above setup, "
                     f"gradients after it {c['grads_after_update'] / MIB:,.0f}")
    for c in d["micro_batch_checks"]:
        cells = ", ".join(f"{k} {c['one'][k] / MIB:,.0f} -> {c['two_micro_batches'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- a second micro-batch, {c['key']} vs {c['vs']} (G {c['G'] / MIB:,.0f}): {cells}")
    for c in d["row_checks"]:
        cells = ", ".join(f"{k} {c['one_row'][k] / MIB:,.0f} -> {c['two_rows'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- two rows per pass instead of one, {c['key']} vs {c['vs']}: {cells} "
                     f"(peak +{c['peak_difference'] / MIB:,.0f})")
    for c in d["length_checks"]:
        cells = ", ".join(f"{k} {c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- per-layer slope from the other length {c['key']} (from {c['from']}) predicted / measured: {cells}")
    for c in d["mixed_from_true_checks"]:
        cells = ", ".join(f"{k} {c['predicted'][k] / MIB:,.0f} / {c['measured'][k] / MIB:,.0f}" for k in PHASES)
        lines.append(f"- bf16-mixed from bf16-true {c['key']} predicted / measured: {cells}")
    lines += ["", "### GPU estimate, full depth, steady state (GiB)", "",
              "| model | tokens | training | trainer resting W+M | + peak phase (runner-up) | = trainer peak | vLLM awake "
              "(weights + KV + workspace) | need, sleep mode | need, no sleep |",
              "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in d["gpu"]:
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} | {_g(r['trainer_resting'])} | "
                     f"{_phase_cell(r)} | {_g(r['trainer_peak'])} | "
                     f"{_g(r['engine_awake'])} ({_g(r['engine_weights'])} + {_g(r['engine_kv'])} + "
                     f"{_g(ENGINE_WORKSPACE)}) | {_g(r['need_sleep_mode'])} | {_g(r['need_no_sleep'])} |")
    for regime, key in (("vLLM sleep mode (the CUDA default)", "fits_sleep_mode"), ("no sleep mode",
                        "fits_no_sleep")):
        lines += ["", f"### Fits on one GPU, {regime}", "",
                  "| model | tokens | training | " + " | ".join(f"{g} ({ACCELERATOR_CARDS[g]})" for g in ACCELERATORS) + " |",
                  "| --- | ---: | --- |" + " :---: |" * len(ACCELERATORS)]
        for r in d["gpu"]:
            need = r["need_sleep_mode" if key == "fits_sleep_mode" else "need_no_sleep"]
            lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} ({_g(need)} GiB) | "
                         + " | ".join(r[key][g] for g in ACCELERATORS) + " |")
    lines += ["", "### What-if: torch's multi-tensor AdamW on CUDA (the optimizer before 1aa4279; sleep mode)", "",
              "| model | tokens | training | trainer peak | need | " + " | ".join(ACCELERATORS) + " |",
              "| --- | ---: | --- | ---: | ---: |" + " :---: |" * len(ACCELERATORS)]
    for r in d["gpu"]:
        w = r["what_if_foreach_adamw"]
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['label']} | {_g(w['trainer_peak'])} | {_g(w['need_sleep_mode'])} | "
                     + " | ".join(w["fits"][g] for g in ACCELERATORS) + " |")
    return "\n".join(lines)


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
    parser.add_argument("--plan", choices=["full", "quick"], help="a named set of points (see plan())")
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
    parser.add_argument("--derive", type=Path, metavar="MEMORY_JSON",
                        help="derive whole-model GPU estimates and fits-on tables from a measurement file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-result", help=argparse.SUPPRESS)
    parser.add_argument("--cap-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        _child_main(args.child, args.child_result, args.cap_bytes)
        return
    if args.derive:
        derive(args.derive)
        return
    if args.quick or args.plan == "quick":
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
