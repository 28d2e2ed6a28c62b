"""Data-parallel scaling of ``rredcot train`` on this machine's CPU: steps/s at world size 1 and 2
with the same global batch, and where each step's time goes.

Every point is a real ``rredcot train`` run (the embedded tiny model, its defaults, ``seed=0``,
``backend.batch_size=32`` at every world size, so the two generate calls of a step and therefore
the samples are the same at world size 1 and 2). A point runs this file as a *driver*
(``--driver``), alone for world size 1 or under ``torchrun --nproc-per-node=2`` for world size 2.
The driver times the train loop through its public seam, ``rredcot_cli.train.steptime.PHASE_OBSERVERS``
(called when each phase of ``Trainer.step`` opens and closes; rredcot_cli is not edited), wraps the
communication and optimizer calls below the loop with wall-clock timers, in its own process only,
then calls ``rredcot_cli.cli.main`` with ``train`` and the overrides, so the stage runs unchanged:

  phase sampling                              a step's start; sampling (the rank's generate calls +
                                              their all-gather)
  phases segment, credit                      credit; the phase is everything between the end of
                                              sampling and the start of the update phase, so it
                                              holds the all-gather of segments and advantages too
  phase update                                update; inside it the old_logprobs phase (the
                                              pre-pass), GradientStepper.backward and
                                              GradientStepper.step (clip + AdamW)
  phase refresh                               weight refresh / sync after the update (inside it
                                              DataParallel.refresh and HFBackend.sync_weights) and
                                              the critic fit
  DataParallel.all_gather_object / sum / barrier / on_main
                                              the train stage's own collectives (blocking calls)
  torch.distributed.all_gather_single / reduce_scatter_single / all_reduce / ...
                                              the collectives FSDP2 issues from Python; on the CPU
                                              they are synchronous (FSDP2 unshards without
                                              async_op off CUDA), so the call time is the time the
                                              rank was blocked in them
  a DDP communication hook                    DDP's gradient all-reduce (issued by the C++ reducer,
                                              invisible to the wrappers above): the default
                                              all-reduce, timed from bucket launch to future
                                              completion (in flight; overlaps the rest of backward)

On one step (``--profile-step``, default 3) the update and the refresh also run under
torch.profiler; its per-op table (communication ops picked out by name) goes into the JSON as a
cross-check, and that step is left out of the s/step averages. Step 1 (warm-up) is left out too.

    python bench/scaling.py                       # the whole matrix -> results/scaling/scaling.json
    python bench/scaling.py --methods grpo --steps 4 --out /tmp/s.json   # a quick look
    python bench/scaling.py --write-md results/scaling/scaling.json           # (re)write docs/studies/scaling.md

Each point's ``seconds`` per step come from the run's own ``train/metrics.parquet`` (rank 0);
the phases from the driver's timers. ``others_cores`` is the CPU other processes on the machine
used while a point ran (from /proc/<pid>/stat, in cores): nonzero means a shared machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from measure import QUIET_CORES, bench_command, loadavg, machine, run_watched, write_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PHASES = ("sampling", "credit", "update", "refresh", "other")
COMM_ORIGINS = ("stage_collectives", "fsdp2_collectives", "ddp_allreduce_in_flight")


# =========================================================================== the driver


class Recorder:
    """Wall-clock intervals of wrapped calls, with the names of the wrapped calls they ran in."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.stack: list[str] = []
        self.opened: list[float] = []  # start times of the open phases
        self.lock = threading.Lock()

    def wrap(self, name: str, fn, kind: str = "call"):
        recorder = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            within = list(recorder.stack)
            recorder.stack.append(name)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                recorder.stack.pop()
                recorder.add(name, kind, t0, t1, within)

        return timed

    def add(self, name, kind, t0, t1, within) -> None:
        with self.lock:
            self.events.append({"name": name, "kind": kind, "t0": t0, "t1": t1, "within": within})

    def phase(self, event: str, name: str) -> None:
        """A ``steptime.PHASE_OBSERVERS`` callback: the loop's phases as events ``phase.<name>``."""
        if event == "begin":
            self.stack.append(f"phase.{name}")
            self.opened.append(time.perf_counter())
            return
        t1, t0 = time.perf_counter(), self.opened.pop()
        self.stack.pop()
        self.add(f"phase.{name}", "phase", t0, t1, list(self.stack))


def _install(recorder: Recorder, profile_step: int, profile_out: Path | None) -> None:
    """Observe the train loop's phases (steptime.PHASE_OBSERVERS) and wrap the calls below it that
    the phases cannot see: backward and optimizer steps, weight syncs, collectives."""
    import torch.distributed as dist

    from rredcot_cli.policy.hf import HFBackend
    # steptime.PHASE_OBSERVERS is the loop's public seam; the stepper and the data-parallel group
    # are wrapped because no seam sees backward, the optimizer step or a collective
    from rredcot_cli.train import distributed, steptime
    from rredcot_cli.train.precision import GradientStepper

    steptime.PHASE_OBSERVERS.append(recorder.phase)
    GradientStepper.backward = recorder.wrap("backward", GradientStepper.backward)
    GradientStepper.step = recorder.wrap("optimizer_step", GradientStepper.step)
    HFBackend.sync_weights = recorder.wrap("sync_weights", HFBackend.sync_weights)
    DP = distributed.DataParallel
    DP.refresh = recorder.wrap("refresh", DP.refresh)
    for name in ("all_gather_object", "sum", "barrier", "on_main"):
        setattr(DP, name, recorder.wrap(f"dp.{name}", getattr(DP, name), kind="comm"))
    for name in ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
                 "all_reduce", "broadcast", "all_gather"):
        if hasattr(dist, name):
            setattr(dist, name, recorder.wrap(f"c10d.{name}", getattr(dist, name), kind="c10d"))

    # DDP's gradient all-reduce: a comm hook around the default one, timed launch -> completion.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def timed_allreduce(state, bucket):
        t0 = time.perf_counter()
        within = list(recorder.stack)
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()

        def done(fut):
            recorder.add("ddp.allreduce", "ddp", t0, time.perf_counter(), within + [f"bytes={nbytes}"])
            return fut.value()[0]

        return default_hooks.allreduce_hook(state, bucket).then(done)

    original_wrap = DP.wrap

    def wrap(self, model, reference=None):
        trained, plain, ref = original_wrap(self, model, reference)
        if self.distributed and self.mode == "ddp":
            trained.register_comm_hook(None, timed_allreduce)
        return trained, plain, ref

    DP.wrap = wrap

    # torch.profiler from the start of step profile_step's update phase to the end of its refresh.
    if profile_step and profile_out is not None:
        state = {"steps": 0, "prof": None}

        def profile_phases(event: str, name: str) -> None:
            if event == "begin" and name == "sampling":
                state["steps"] += 1
            elif event == "begin" and name == "update" and state["steps"] == profile_step:
                from torch.profiler import ProfilerActivity, profile

                state["prof"] = profile(activities=[ProfilerActivity.CPU])
                state["prof"].start()
            elif event == "end" and name == "refresh" and state["prof"] is not None:
                prof, state["prof"] = state["prof"], None
                prof.stop()
                profile_out.write_text(json.dumps(_profile_table(prof), indent=1))

        steptime.PHASE_OBSERVERS.append(profile_phases)


COMM_WORDS = ("gloo", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast",
              "barrier", "c10d", "nccl", "fsdp::", "record_param_comms")


def _profile_table(prof) -> dict:
    """The profiled ops (total CPU time, calls), the communication ones picked out by name."""
    rows = []
    for ev in prof.key_averages():
        rows.append({"name": ev.key, "calls": ev.count, "cpu_total_s": ev.cpu_time_total / 1e6,
                     "self_cpu_s": ev.self_cpu_time_total / 1e6})
    comm = [r for r in rows if any(w in r["name"].lower() for w in COMM_WORDS)]
    rows.sort(key=lambda r: -r["self_cpu_s"])
    comm.sort(key=lambda r: -r["cpu_total_s"])
    return {"top_self_cpu": rows[:15], "communication": comm[:25]}


def driver(args: argparse.Namespace) -> None:
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.events_dir)
    out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    _install(recorder, args.profile_step, out / f"profile-rank{rank}.json")
    from rredcot_cli import cli

    sys.argv = ["rredcot", "train", *args.overrides]
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code or 0
    (out / f"events-rank{rank}.json").write_text(json.dumps({"rank": rank, "events": recorder.events}))
    sys.exit(code)


# =========================================================================== the bench


def point_command(world: int, threads: int, mode: str, method: str, steps: int, run_dir: Path, events: Path,
                  profile_step: int, extra: list[str]) -> tuple[list[str], dict]:
    overrides = [f"method={method}", "seed=0", f"train.steps={steps}", "train.eval_every=0", "train.save_every=0",
                 "train.eval_problems=8", "backend.batch_size=32", f"backend.num_threads={threads}",
                 f"train.parallel={mode}", f"run.dir={run_dir}", "run.overwrite=true", *extra]
    driver_args = [str(Path(__file__).resolve()), "--driver", "--events-dir", str(events),
                   "--profile-step", str(profile_step), "--", *overrides]
    if world == 1:
        cmd = [sys.executable, *driver_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", *driver_args]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return cmd, env


def phases_of(events: list[dict], step_seconds: list[float] | None) -> list[dict]:
    """Per step of one rank: the phase seconds (sampling, credit, update, refresh, other), the
    sub-phases and the communication inside each phase."""
    starts = [e for e in events if e["name"] == "phase.sampling"]
    starts.sort(key=lambda e: e["t0"])
    later_end = [e["t0"] for e in events if e["name"] == "phase.eval"]
    steps = []
    for i, ts in enumerate(starts):
        lo = ts["t0"]
        if i + 1 < len(starts):
            hi = starts[i + 1]["t0"]
        else:
            after = [t for t in later_end if t > lo]
            hi = min(after) if after else max(e["t1"] for e in events)
        inside = [e for e in events if lo <= e["t0"] < hi]

        def first(name):
            found = [e for e in inside if e["name"] == name]
            return found[0] if found else None

        def total(name, lo_=lo, hi_=hi):
            return sum(e["t1"] - e["t0"] for e in inside if e["name"] == name and lo_ <= e["t0"] < hi_)

        pu, rf = first("phase.update"), first("phase.refresh")
        sampling = ts["t1"] - ts["t0"]
        credit = (pu["t0"] - ts["t1"]) if pu else 0.0
        upd = (pu["t1"] - pu["t0"]) if pu else 0.0
        refresh_end = rf["t1"] if rf else (pu["t1"] if pu else ts["t1"])
        refresh = refresh_end - pu["t1"] if pu else 0.0
        wall = step_seconds[i] if step_seconds and i < len(step_seconds) else hi - lo
        bounds = {"sampling": (ts["t0"], ts["t1"]), "credit": (ts["t1"], pu["t0"] if pu else ts["t1"]),
                  "update": (pu["t0"], pu["t1"]) if pu else (0, 0), "refresh": (pu["t1"], refresh_end) if pu else (0, 0)}
        comm = {}
        for phase, (a, b) in bounds.items():
            stage = sum(e["t1"] - e["t0"] for e in inside if e["kind"] == "comm" and a <= e["t0"] < b
                        and not any(w.startswith("dp.") for w in e["within"]))
            fsdp = sum(e["t1"] - e["t0"] for e in inside if e["kind"] == "c10d" and a <= e["t0"] < b
                       and not any(w.startswith("dp.") for w in e["within"]))
            ddp = _union([(e["t0"], min(e["t1"], b)) for e in inside if e["kind"] == "ddp" and a <= e["t0"] < b])
            comm[phase] = {"stage_collectives": stage, "fsdp2_collectives": fsdp, "ddp_allreduce_in_flight": ddp}
        steps.append({
            "step": i + 1, "seconds": wall,
            "phases": {"sampling": sampling, "credit": credit, "update": upd, "refresh": refresh,
                       "other": wall - sampling - credit - upd - refresh},
            "sub": {"credit.segment": total("phase.segment"), "credit.credit": total("phase.credit"),
                    "update.prepass": total("phase.old_logprobs"), "update.backward": total("backward"),
                    "update.optimizer_step": total("optimizer_step"),
                    "refresh.dp_refresh": total("refresh"), "refresh.sync_weights": total("sync_weights")},
            "comm": comm,
            "ddp_buckets": sum(1 for e in inside if e["kind"] == "ddp"),
        })
    return steps


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(steps: list[dict], skip: set[int]) -> dict:
    kept = [s for s in steps if s["step"] not in skip]

    def mean(get):
        vals = [get(s) for s in kept]
        return statistics.fmean(vals) if vals else float("nan")

    out = {"steps_averaged": [s["step"] for s in kept], "s_per_step": mean(lambda s: s["seconds"]),
           "s_per_step_median": statistics.median([s["seconds"] for s in kept]) if kept else float("nan"),
           "phases": {p: mean(lambda s, p=p: s["phases"][p]) for p in PHASES},
           "sub": {k: mean(lambda s, k=k: s["sub"][k]) for k in kept[0]["sub"]} if kept else {},
           "comm": {p: {o: mean(lambda s, p=p, o=o: s["comm"][p][o]) for o in COMM_ORIGINS}
                    for p in ("sampling", "credit", "update", "refresh")}}
    out["comm_total"] = sum(v for p in out["comm"].values() for v in p.values())
    return out


def run_point(spec: dict, steps: int, profile_step: int, work: Path, extra: list[str]) -> dict:
    name = f"w{spec['world']}-t{spec['threads']}-{spec['mode']}-{spec['method']}"
    run_dir, events = work / name / "run", work / name / "events"
    cmd, env = point_command(spec["world"], spec["threads"], spec["mode"], spec["method"], steps, run_dir, events,
                             profile_step, extra)
    load_before = loadavg()
    proc, info, watcher = run_watched(cmd, env, name)
    result = {**spec, "name": name, **info, "command": "OMP_NUM_THREADS={0} MKL_NUM_THREADS={0} ".format(spec["threads"])
              + info["command"], "loadavg_before": load_before, "load_samples": watcher.samples}
    if proc.returncode != 0:
        return result
    from rredcot_cli.store import metrics_log

    metrics = metrics_log.read(run_dir / "train" / "metrics.parquet").to_pylist()
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    result["metrics"] = [{k: m[k] for k in ("step", "seconds", "reward_mean", "tokens", "loss", "grad_norm")}
                         for m in metrics]
    result["summary_seconds"] = summary["seconds"]
    skip = {1, profile_step}
    result["ranks"] = {}
    for f in sorted(events.glob("events-rank*.json")):
        data = json.loads(f.read_text())
        secs = [m["seconds"] for m in metrics] if data["rank"] == 0 else None
        per_step = phases_of(data["events"], secs)
        result["ranks"][str(data["rank"])] = {"per_step": per_step, "mean": summarize(per_step, skip)}
    for f in sorted(events.glob("profile-rank*.json")):
        result.setdefault("profile_step", profile_step)
        result.setdefault("profile", {})[f.stem.removeprefix("profile-")] = json.loads(f.read_text())
    m = result["ranks"]["0"]["mean"]
    print(f"  {m['s_per_step']:.2f} s/step  " + "  ".join(f"{p} {m['phases'][p]:.2f}" for p in PHASES)
          + f"  comm {m['comm_total']:.2f}  others_cores {result['others_cores_mean']}", flush=True)
    return result


def matrix(methods: list[str]) -> list[dict]:
    points = []
    for method in methods:
        points += [{"world": 1, "threads": 1, "mode": "ddp", "method": method},
                   {"world": 1, "threads": 2, "mode": "ddp", "method": method},
                   {"world": 2, "threads": 1, "mode": "ddp", "method": method},
                   {"world": 2, "threads": 1, "mode": "fsdp2", "method": method}]
    return points


def add_scaling(results: list[dict]) -> None:
    """speedup = (s/step at world 1, 1 thread) / (s/step of the point); efficiency = speedup / W
    (and, against world 1 with 2 threads, the speedup over the fair use of the same 2 cores)."""
    for r in results:
        if r.get("returncode") != 0:
            continue
        base = {(b["method"], b["threads"]): b for b in results if b["world"] == 1 and b.get("returncode") == 0}
        one = base.get((r["method"], 1))
        two = base.get((r["method"], 2))
        s = r["ranks"]["0"]["mean"]["s_per_step"]
        if one:
            r["speedup_vs_w1t1"] = one["ranks"]["0"]["mean"]["s_per_step"] / s
            r["efficiency"] = r["speedup_vs_w1t1"] / r["world"]
        if two:
            r["speedup_vs_w1t2"] = two["ranks"]["0"]["mean"]["s_per_step"] / s
        if one:
            same = [a["tokens"] for a in one["metrics"]] == [a["tokens"] for a in r["metrics"]] and \
                   [a["reward_mean"] for a in one["metrics"]] == [a["reward_mean"] for a in r["metrics"]]
            r["samples_match_w1t1"] = same


# --------------------------------------------------------------------------- the write-up


def write_md(data: dict, path: Path) -> None:
    rows = [r for r in data["results"] if r.get("returncode") == 0]
    shared = any((r.get("others_cores_mean") or 0) > QUIET_CORES for r in data["results"])
    L = []
    L.append("# Data-parallel scaling of `rredcot train` on a 2-core CPU\n")
    L.append(f"Measured {data['date']} with `bench/scaling.py` (raw numbers: `results/scaling/scaling.json`). "
             f"Machine: {data['machine']['cpu_model']}, {data['machine']['logical_cpus']} logical CPUs, "
             f"{data['machine']['mem_gb']} GB, torch {data['machine']['torch']} (CPU build), Python "
             f"{data['machine']['python']}. Embedded tiny model with the default config, `seed=0`, "
             f"{data['steps']} steps per run; s/step is the mean of `train/metrics.parquet`'s `seconds` over steps "
             f"{data['results'][0]['ranks']['0']['mean']['steps_averaged'] if rows else '?'} (step 1 is warm-up, "
             f"step {data['profile_step']} ran under torch.profiler; both left out).\n")
    if shared:
        L.append("**Measured on a shared machine**: other processes used CPU during some points "
                 "(column *others*, mean cores busy outside this bench while the point ran). On a 2-core machine "
                 "every 0.1 core taken by someone else is 5% of the machine, so treat those rows as noisy.\n")
    L.append("## Steps per second and scaling\n")
    L.append("speedup = s/step of world 1 with 1 thread / s/step of the row; efficiency = speedup / world size. "
             "*vs 2 threads* = s/step of world 1 with 2 threads / s/step of the row: the comparison that matters "
             "on this machine, where the alternative to 2 ranks is one rank using both cores.\n")
    L.append("| world | mode | threads/rank | method | s/step | steps/s | speedup | efficiency | vs 2 threads "
             "| sampling | credit | update | refresh | other | comm (in phases) | others |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["ranks"]["0"]["mean"]
        ph = m["phases"]
        mode = r["mode"] if r["world"] > 1 else "-"
        L.append(f"| {r['world']} | {mode} | {r['threads']} | {r['method']} | {m['s_per_step']:.2f} | "
                 f"{1 / m['s_per_step']:.3f} | {r.get('speedup_vs_w1t1', float('nan')):.2f} | "
                 f"{r.get('efficiency', float('nan')):.2f} | {r.get('speedup_vs_w1t2', float('nan')):.2f} | "
                 + " | ".join(f"{ph[p]:.2f}" for p in PHASES)
                 + f" | {m['comm_total']:.2f} | {r.get('others_cores_mean') or 0:.2f} |")
    failed = [r for r in data["results"] if r.get("returncode") != 0]
    for r in failed:
        L.append(f"\nFAILED: {r['name']} (rc {r['returncode']}): `{r['command']}`")
    L.append("\nPhases are rank 0's seconds per step (mean over the averaged steps), from the loop's own phases "
             "(`steptime.PHASE_OBSERVERS`): *sampling* = the sampling phase (the rank's generate calls, "
             "verification, and the all-gather of the rows); *credit* = from the end of sampling to the start of "
             "the update phase (segmenting, the credit method, and under torchrun the all-gathers of segments and "
             "advantages); *update* = the update phase (old-log-prob pre-pass, forward/backward per minibatch, "
             "clip + AdamW); *refresh* = the refresh phase (`DataParallel.refresh`, `backend.sync_weights`, the "
             "critic fit); *other* = the rest of the step (metrics row, progress bar). *comm* is the time inside "
             "these phases spent in collectives (next section).\n")
    L.append("## Where the time goes, in detail\n")
    L.append("| point | prepass | backward | optimizer | segment | credit | dp.refresh | stage collectives "
             "(sampling/credit/update/refresh) | FSDP2 collectives (update/refresh) | DDP all-reduce in flight "
             "(update) | rank 1 s in sampling / update |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["ranks"]["0"]["mean"]
        s, c = m["sub"], m["comm"]
        r1 = r["ranks"].get("1", {}).get("mean")
        r1s = f"{r1['phases']['sampling']:.2f} / {r1['phases']['update']:.2f}" if r1 else "-"
        L.append(f"| {r['name']} | {s['update.prepass']:.2f} | {s['update.backward']:.2f} | "
                 f"{s['update.optimizer_step']:.3f} | {s.get('credit.segment', s.get('credit.segment_rows')):.3f} | "
                 f"{s.get('credit.credit', s.get('credit.attribute')):.3f} | "
                 f"{s['refresh.dp_refresh']:.3f} | "
                 + "/".join(f"{c[p]['stage_collectives']:.2f}" for p in ("sampling", "credit", "update", "refresh"))
                 + f" | {c['update']['fsdp2_collectives']:.2f}/{c['refresh']['fsdp2_collectives']:.2f} | "
                 f"{c['update']['ddp_allreduce_in_flight']:.2f} | {r1s} |")
    L.append("")
    for note in data.get("notes", []):
        L.append(note + "\n")
    L.append("## Reproduce\n")
    L.append("```\n" + data["bench_command"] + "\n```\n")
    L.append("which runs, per point (world 2 under torchrun; the driver is this same file):\n")
    L.append("```\n" + "\n".join(r["command"] for r in data["results"]) + "\n```\n")
    path.write_text("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--events-dir", help=argparse.SUPPRESS)
    ap.add_argument("--methods", default="grpo,rredcot")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile-step", type=int, default=3, help="step whose update runs under torch.profiler (0: none)")
    ap.add_argument("--only", default="", help="comma-separated point names (w2-t1-ddp-grpo, ...) to run")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "scaling" / "scaling.json"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "studies" / "scaling.md"))
    ap.add_argument("--write-md", metavar="JSON", help="only (re)write the markdown from a result file")
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("overrides", nargs="*", help="extra rredcot overrides (driver: all of them)")
    args = ap.parse_args()
    if args.driver:
        return driver(args)
    if args.write_md:
        data = json.loads(Path(args.write_md).read_text())
        return write_md(data, Path(args.md))
    work = Path(args.work or tempfile.mkdtemp(prefix="rredcot-scaling-"))
    points = matrix(args.methods.split(","))
    if args.only:
        wanted = set(args.only.split(","))
        points = [p for p in points if f"w{p['world']}-t{p['threads']}-{p['mode']}-{p['method']}" in wanted]
    data = {"date": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "steps": args.steps,
            "seed": 0, "profile_step": args.profile_step,
            "bench_command": bench_command("scaling.py"), "loadavg_start": loadavg(), "results": []}
    t0 = time.perf_counter()
    for spec in points:
        data["results"].append(run_point(spec, args.steps, args.profile_step, work, args.overrides))
        add_scaling(data["results"])
        write_json(Path(args.out), data)
    data["loadavg_end"] = loadavg()
    data["total_wall_s"] = time.perf_counter() - t0
    write_json(Path(args.out), data)
    write_md(data, Path(args.md))
    print(f"wrote {args.out} and {args.md} in {data['total_wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
