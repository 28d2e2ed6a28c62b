"""What the bench scripts measure with, in one place: this process's resident memory (and its peak
per phase of an update), the machine and how busy other processes keep it, a child run watched
while it runs, the steps of a ``rredcot train`` run read back from its metrics, the record's
provenance (commit, command) and strict JSON, and one policy update set up as the train stage sets
it up.

A script imports it as ``from measure import ...``: Python puts a script's own folder first on
``sys.path`` (``python bench/x.py``, ``torchrun bench/x.py``), and tests/repo_scripts.py does the
same when a test loads a script.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Above this many cores used by other processes while a figure was taken, the figure is a busy
# machine's (on 2 cores every 0.1 core is 5% of the machine).
QUIET_CORES = 0.15


# =========================================================================== memory of this process


def proc_status(field_name: str) -> int:
    """A ``VmXXX`` field of /proc/self/status in bytes (VmRSS: resident now, VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field_name)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return proc_status("VmHWM") <= proc_status("VmRSS") + (1 << 20)


class PhaseMeter:
    """Resident high-water mark of each phase of an update: ``mark(name)`` closes the phase that
    ran since the previous mark (its peak is kept, the maximum over repeats) and starts the next."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        reset_peak_rss()

    def mark(self, name: str) -> None:
        self.peaks[name] = max(self.peaks.get(name, 0), proc_status("VmHWM"))
        reset_peak_rss()


# =========================================================================== the machine and its load


def cpuinfo() -> dict[str, str]:
    """The fields of /proc/cpuinfo's first processor (``model name``, ``flags``, ...)."""
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}


def mem_total_bytes() -> int:
    return next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal"))


def machine() -> dict:
    """The CPU, memory and torch of this machine (the ``machine`` of scaling/throughput results)."""
    # torch is imported here, not at the top: the scripts that only read results do not need it
    import torch

    fields = cpuinfo()
    return {
        "cpu_model": fields.get("model name"), "logical_cpus": Path("/proc/cpuinfo").read_text().count("processor\t:"),
        "os_cpu_count": os.cpu_count(), "cpu_mhz": fields.get("cpu MHz"), "cache_size": fields.get("cache size"),
        "flags_avx512f": "avx512f" in fields.get("flags", ""), "flags_amx": "amx_tile" in fields.get("flags", ""),
        "mem_gb": round(mem_total_bytes() / 2**30, 1), "python": platform.python_version(), "torch": torch.__version__,
        "torch_threads_default": torch.get_num_threads(), "kernel": platform.release(),
    }


def loadavg() -> list[str]:
    """/proc/loadavg's 1, 5 and 15 minute load averages, as written there."""
    return Path("/proc/loadavg").read_text().split()[:3]


def busy(others_cores: float | None) -> str:
    return "busy" if (others_cores or 0.0) > QUIET_CORES else "quiet"


class LoadWatcher:
    """Every ``period`` s: /proc/loadavg, and the CPU (in cores) used by processes outside this
    bench's process tree, from the utime+stime deltas in /proc/<pid>/stat."""

    def __init__(self, period: float = 3.0) -> None:
        self.period, self.samples, self.stop_event = period, [], threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _procs() -> dict[int, tuple[int, int, str]]:
        out = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            rest = raw[raw.rindex(")") + 2 :].split()
            out[int(entry)] = (int(rest[1]), int(rest[11]) + int(rest[12]), name)  # ppid, utime+stime, comm
        return out

    def _ours(self, procs) -> set[int]:
        ours, me = set(), os.getpid()
        for pid in procs:
            p, seen = pid, 0
            while p and p in procs and seen < 64:
                if p == me:
                    ours.add(pid)
                    break
                p, seen = procs[p][0], seen + 1
        return ours

    def _loop(self) -> None:
        before, t_before = self._procs(), time.monotonic()
        while not self.stop_event.wait(self.period):
            now, t_now = self._procs(), time.monotonic()
            ours = self._ours(now)
            elapsed = (t_now - t_before) * self.tick
            other, mine, hogs = 0.0, 0.0, {}
            for pid, (_, ticks, name) in now.items():
                delta = (ticks - before[pid][1]) / elapsed if pid in before else 0.0
                if pid in ours:
                    mine += delta
                else:
                    other += delta
                    if delta > 0.1:
                        hogs[f"{pid}:{name}"] = round(delta, 2)
            self.samples.append({"t": round(time.time(), 1), "loadavg": loadavg(),
                                 "ours_cores": round(mine, 2), "others_cores": round(other, 2), "others": hogs})
            before, t_before = now, t_now

    def others_cores(self) -> dict:
        """Mean and most cores other processes used over the samples (None without a sample)."""
        others = [s["others_cores"] for s in self.samples]
        return {"others_cores_mean": statistics.fmean(others) if others else None,
                "others_cores_max": max(others) if others else None}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join()


# =========================================================================== running and recording


def run_watched(cmd: list[str], env: dict, label: str) -> tuple[subprocess.CompletedProcess, dict, LoadWatcher]:
    """Run ``cmd`` in the repository with ``env`` added, its output captured, while a LoadWatcher
    samples the machine; the record: the command (this interpreter written ``python``), exit code,
    wall and CPU seconds of the child, the other processes' cores, and stderr's tail on failure."""
    print(f"[{dt.datetime.now():%H:%M:%S}] {label}: {shlex.join(cmd)}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with LoadWatcher() as watcher:
        proc = subprocess.run(cmd, env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = {"command": shlex.join(cmd).replace(sys.executable, "python"), "returncode": proc.returncode,
            "wall_s": time.perf_counter() - t0,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            **watcher.others_cores()}
    if proc.returncode:
        info["stderr_tail"] = proc.stderr[-4000:]
        print(f"  FAILED rc={proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
    return proc, info, watcher


def result_line(stdout: str, tag: str) -> dict | None:
    """The JSON a driver printed after ``tag`` (``DECODE_RESULT {...}``), None if it printed none."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(tag + " ")), None)
    return json.loads(line.removeprefix(tag + " ")) if line else None


def git(*args: str) -> str:
    """``git ARGS`` in the repository; its output, '' where git fails or is missing."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def commit() -> str:
    """The short commit of the repository's HEAD."""
    return git("rev-parse", "--short", "HEAD")


def bench_command(script: str) -> str:
    """This invocation as a user types it: ``python bench/SCRIPT ARGS``."""
    return shlex.join(["python", f"bench/{script}", *sys.argv[1:]])


def finite(x):
    """NaN and infinities as null, in dicts and lists too (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def write_json(path: Path, data, indent: int = 1) -> None:
    """``data`` as JSON at ``path``, its folder made first (rewritten after every point of a bench,
    so an interrupted bench keeps what it measured)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")


def vllm_importable(python: str) -> bool:
    """Whether interpreter ``python`` exists and imports vllm and this project."""
    if not python or not Path(python).exists():
        return False
    return subprocess.run([python, "-c", "import vllm, rredcot_cli"], capture_output=True).returncode == 0


# =========================================================================== a train run's steps


def mean_defined(values) -> float | None:
    """Mean of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def train_steps(train_dir: Path) -> list[dict]:
    """Each row of ``train_dir/metrics.parquet`` with the tokens generated in that step (the
    ``tokens`` column counts from the run's start) and the seconds of each phase of the metrics
    schema (``seconds_<phase>``; 0.0 where the phase did not run)."""
    # the store is imported here: only the scripts that read a run need it (and memory.py's
    # process floor stays torch, transformers and peft)
    from rredcot_cli.store import metrics_log
    from rredcot_cli.store.artifacts import PHASES

    steps, previous = [], 0
    for row in metrics_log.read(Path(train_dir) / "metrics.parquet").to_pylist():
        tokens, previous = row["tokens"] - previous, row["tokens"]
        steps.append({"row": row, "tokens": tokens, "phases": {p: row.get(f"seconds_{p}") or 0.0 for p in PHASES}})
    return steps


def mean_step(steps: list[dict]) -> dict:
    """Means over ``steps`` (step dicts with seconds, tokens, credit_forward_tokens and phases)."""
    # the store is imported here, as in train_steps
    from rredcot_cli.store.artifacts import PHASES

    return {"steps_averaged": [s["step"] for s in steps], "s_per_step": mean_defined(s["seconds"] for s in steps),
            "tokens_per_step": mean_defined(s["tokens"] for s in steps),
            "credit_forward_tokens": mean_defined(s["credit_forward_tokens"] for s in steps),
            "phases": {p: mean_defined(s["phases"][p] for s in steps) or 0.0 for p in PHASES}}


# =========================================================================== one policy update
#
# The train stage runs whole runs; the memory and speed figures need one update on their own, so
# these reach into rredcot_cli.train (the update, its optimizer and schedule): there is no public
# seam for "one update" and the figures must be of the code the train stage runs.


def optimizer_as_trained(model, lr: float, device: str, foreach: bool = False):
    """AdamW and a constant schedule as the train stage builds them for ``device`` (betas 0.9,
    0.99, no weight decay); ``foreach``: torch's multi-tensor AdamW instead (CUDA's default, the
    train stage's CUDA optimizer before commit 1aa4279)."""
    # torch and the train internals are imported here: the scripts that only read results do not need them
    import torch

    from rredcot_cli.train.precision import make_optimizer
    from rredcot_cli.train.update import lr_lambda

    if foreach:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0, foreach=True)
    else:
        optimizer = make_optimizer(model, lr=lr, betas=(0.9, 0.99), weight_decay=0.0, device=device)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 1))


def prime_moments(optimizer, params) -> None:
    """Allocate AdamW's moments as every update after a run's first finds them: one step on zero
    gradients (the moments stay zero, the weights do not move), then drop the gradients."""
    # torch is imported here, as in optimizer_as_trained
    import torch

    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gc.collect()


def state_bytes(model, optimizer) -> tuple[int, int]:
    """Bytes of the model's parameters (a tied weight once) and of the optimizer's state tensors."""
    # torch is imported here, as in optimizer_as_trained
    import torch

    unique = {id(p): p for p in model.parameters()}.values()
    return (sum(p.numel() * p.element_size() for p in unique),
            sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t)))


def one_update(model, optimizer, scheduler, batch: dict, forward, stepper, generator=None):
    """``policy_update`` on ``batch`` (prompt_ids, completion_ids, advantages, pad_id, max_tokens
    and optionally sampler_logprobs) as one minibatch, one pass: PPO's clip 0.2 either side,
    token-mean, no KL, gradients clipped at 1; with sampler log-probs they stand for the old ones
    (no pre-pass). ``generator`` shuffles the rows (default: seeded 0)."""
    # torch and the train internals are imported here, as in optimizer_as_trained
    import torch

    from rredcot_cli.train.loss import LossSettings
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update

    sampler = batch.get("sampler_logprobs")
    return policy_update(
        model, optimizer, scheduler,
        UpdateBatch(batch["prompt_ids"], batch["completion_ids"], batch["advantages"], batch["pad_id"], sampler),
        UpdateHyper(updates_per_batch=1, minibatch_size=len(batch["completion_ids"]),
                    loss=LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean", max_tokens=batch["max_tokens"]),
                    old_from_sampler=sampler is not None),
        UpdateEngine(generator=generator or torch.Generator().manual_seed(0), forward=forward, stepper=stepper))


def metered_stepper(phases: PhaseMeter, stepper_cls, record: dict):
    """A ``GradientStepper`` subclass, and a wrapper of the update's old-log-prob pre-pass, that
    only call ``phases.mark`` around the real ones, so policy_update runs unchanged and each
    phase's peak is seen: prepass, forward (a micro-batch's forward and loss), backward, step
    (gradient clipping and AdamW). It also records the gradient bytes allocated when the step
    begins (``grad_bytes_at_step``: G, since policy_update frees the gradients after its last step)."""
    # the update module is imported here: patching its pre-pass is the only way to see that phase
    from rredcot_cli.train import update

    real_prepass = update.chunked_completion_logprobs

    def prepass(*args, **kwargs):
        phases.mark("other")
        out = real_prepass(*args, **kwargs)
        phases.mark("prepass")
        return out

    update.chunked_completion_logprobs = prepass

    class MeteredStepper(stepper_cls):
        def backward(self, loss):
            phases.mark("forward")
            super().backward(loss)
            phases.mark("backward")

        def step(self, optimizer, parameters, grad_clip):
            phases.mark("other")
            record["grad_bytes_at_step"] = sum(p.grad.numel() * p.grad.element_size() for p in parameters
                                               if p.grad is not None)
            result = super().step(optimizer, parameters, grad_clip)
            phases.mark("step")
            return result

    return MeteredStepper
