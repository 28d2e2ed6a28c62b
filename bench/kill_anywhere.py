"""Kill ``rredcot train`` with SIGKILL at many moments, resume it each time, and check that it ends
with the metrics, held-out eval and final weights of an uninterrupted run (issue 31).

Each attempt runs ``rredcot train ... train.resume=true`` in a child process that reports the phase
it is in (``steptime.PHASE_OBSERVERS``, the loop's public seam) into a small file; the driver kills
it at a moment drawn from a seeded plan, cycling through the targets

  time        a random moment of the attempt (startup, model load and eval included)
  sampling    a random moment inside the sampling phase of a step
  update      a random moment inside the policy update
  artifact    while a Parquet artifact or a step's saved rollouts are being written (a ``*.tmp-*``)
  checkpoint  while ``checkpoints/step-N`` is being written (its ``step-N.tmp-*`` folder exists)
  prune       while an old checkpoint is being deleted (``step-N.tmp-pruned``; a short window)

and records what it hit (the phase, the temporaries on disk, the finished steps). A target that does
not show up before the attempt ends is counted as missed, not as a kill. When a run completes before
``--kills`` kills, it is compared and a fresh run starts (a "round"). Writes one JSON file to
``--out`` (default results/kill-anywhere/) and exits non-zero when any round differs.

    python bench/kill_anywhere.py --kills 20 --seed 0
    python bench/kill_anywhere.py --kills 3 --out /tmp/k -- train.steps=4     # the CI test's version
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Small, with a policy gradient at every step, a checkpoint after every step (so checkpoint writes and
# pruning happen often), saved rollouts every step (more artifact writes) and held-out evals.
SETTINGS = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
    "train.steps=8", "train.prompts_per_step=2", "train.minibatch_size=2", "train.updates_per_batch=2",
    "train.lr=3e-5", "train.lr_schedule=constant", "train.warmup_steps=1", "train.eval_every=2",
    "train.eval_problems=2", "train.eval_samples=2",
]
KILLED_RUN = ["train.save_every=1", "train.keep_checkpoints=2", "train.save_rollouts=2"]
TARGETS = ("time", "sampling", "update", "artifact", "checkpoint", "prune")
CLOCK_PREFIX = "seconds"

# The child: report each phase into $KILL_PHASE_FILE, then run the CLI.
CHILD = """
import os, sys
from rredcot_cli.train import steptime
path = os.environ["KILL_PHASE_FILE"]
def observe(event, name):
    with open(path, "w") as f:
        f.write(f"{event} {name}")
steptime.PHASE_OBSERVERS.append(observe)
sys.argv = ["rredcot", *sys.argv[1:]]
from rredcot_cli.cli import main
main()
"""


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def result(run: Path) -> dict:
    """What must be equal: metrics without the clock columns, the held-out eval, the final weights."""
    import pyarrow.parquet as pq

    train = run / "train"
    from rredcot_cli.store import metrics_log

    metrics = metrics_log.read(train / "metrics.parquet")
    metrics = metrics.drop([c for c in metrics.column_names if c.startswith(CLOCK_PREFIX)])
    weights = hashlib.sha256((train / "checkpoints" / "final" / "model.safetensors").read_bytes()).hexdigest()
    return {"metrics": metrics.to_pylist(), "eval": pq.read_table(train / "eval.parquet").to_pylist(),
            "weights": weights}


def temporaries(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for p in run.rglob("*.tmp-*"))


def finished_steps(run: Path) -> int:
    from rredcot_cli.store import metrics_log

    try:
        return metrics_log.read(run / "train" / "metrics.parquet").num_rows
    except Exception:  # noqa: BLE001 - none yet
        return 0


def trigger(target: str, run: Path, phase_file: Path, rng: random.Random, horizon: float):
    """A predicate ``(elapsed) -> bool``: kill now?"""
    if target == "time":
        moment = rng.uniform(0, horizon)
        return lambda elapsed: elapsed >= moment
    if target in ("sampling", "update"):
        delay = rng.uniform(0, 0.3)
        entered: list[float] = []

        def in_phase(elapsed):
            try:
                now = phase_file.read_text()
            except OSError:
                return False
            if now != f"begin {target}":
                entered.clear()
                return False
            if not entered:
                entered.append(elapsed)
            return elapsed - entered[0] >= delay
        return in_phase
    patterns = {"artifact": ("**/*.parquet.tmp-*", "train/rollouts/step-*.tmp-*"),
                "checkpoint": ("train/checkpoints/step-*.tmp-*",), "prune": ("train/checkpoints/*.tmp-pruned",)}[target]

    stale = {p for pattern in patterns for p in run.glob(pattern)}  # a killed attempt's, removed at startup

    def writing(elapsed):
        return any(name not in stale for pattern in patterns for name in run.glob(pattern)
                   if not name.name.endswith("-pruned") or target == "prune")
    return writing


def attempt(run: Path, overrides: list[str], target: str | None, rng: random.Random, horizon: float) -> dict:
    """One attempt, killed when ``target``'s moment comes (None: run to the end)."""
    with tempfile.NamedTemporaryFile(prefix="phase-", delete=False) as handle:
        phase_file = Path(handle.name)
    child = subprocess.Popen([sys.executable, "-c", CHILD, "train", f"run.dir={run}", *overrides, "train.resume=true"],
                             cwd=run.parent, env={**env(), "KILL_PHASE_FILE": str(phase_file)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kill_now = trigger(target, run, phase_file, rng, horizon) if target else (lambda elapsed: False)
    began = time.monotonic()
    record = {"target": target}
    try:
        while child.poll() is None:
            elapsed = time.monotonic() - began
            if kill_now(elapsed):
                phase = phase_file.read_text() if phase_file.exists() else ""
                on_disk = temporaries(run)
                child.send_signal(signal.SIGKILL)
                child.wait()
                record.update(killed=True, at_seconds=round(elapsed, 3), phase=phase, temporaries=on_disk,
                              finished_steps=finished_steps(run))
                break
            time.sleep(0.001 if target in ("artifact", "checkpoint", "prune") else 0.005)
        else:
            record.update(killed=False, returncode=child.returncode, seconds=round(time.monotonic() - began, 3))
            if child.returncode != 0:
                record["stderr_tail"] = child.stderr.read()[-2000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
        phase_file.unlink(missing_ok=True)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "kill-anywhere")
    parser.add_argument("--work", type=Path, help="where the runs go (default: a temporary folder, deleted)")
    parser.add_argument("--reference", type=Path, help="an uninterrupted run dir of the same settings to reuse")
    parser.add_argument("overrides", nargs="*", help="rredcot overrides after the bench's own settings")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    overrides = [*SETTINGS, *args.overrides]
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-anywhere-"))
    work.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()
    reference = args.reference
    if reference is None:
        reference = work / "reference"
        done = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", f"run.dir={reference}", *overrides],
                              cwd=work, env=env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{done.stderr[-3000:]}")
    reference_seconds = time.monotonic() - began
    expected = result(reference)

    kills, missed, rounds = [], 0, []
    plan = [TARGETS[i % len(TARGETS)] for i in range(args.kills)]
    rng.shuffle(plan)
    while len(kills) < args.kills:
        run = work / f"killed-{len(rounds)}"
        attempts = []
        while True:
            target = plan[len(kills)] if len(kills) < args.kills else None
            record = attempt(run, [*overrides, *KILLED_RUN], target, rng, horizon=reference_seconds)
            attempts.append(record)
            print(json.dumps(record), flush=True)
            if record["killed"]:
                kills.append(record)
                continue
            if record["returncode"] != 0:
                raise SystemExit(f"an attempt failed: {record.get('stderr_tail')}")
            if target is not None:
                missed += 1
            break
        same = result(run) == expected
        rounds.append({"run": run.name, "attempts": len(attempts), "kills": sum(a["killed"] for a in attempts),
                       "identical": same, "leftover_temporaries": temporaries(run)})
        print(json.dumps(rounds[-1]), flush=True)

    report = {
        "study": "kill-anywhere", "seed": args.seed, "kills": len(kills), "missed_targets": missed,
        "rounds": rounds, "identical": all(r["identical"] for r in rounds),
        "kills_by_target": {t: sum(k["target"] == t for k in kills) for t in TARGETS},
        # (temporaries seen at startup are the killed attempt's, not being written: not counted)
        "kills_with_a_checkpoint_being_written": sum(any("checkpoints/step-" in p and "pruned" not in p
                                                         for p in k["temporaries"]) for k in kills if k["phase"]),
        "kills_while_pruning": sum(any(p.endswith("tmp-pruned") for p in k["temporaries"])
                                   for k in kills if k["phase"]),
        "kills_with_an_artifact_being_written": sum(any(".parquet.tmp-" in p or "rollouts/step-" in p
                                                        for p in k["temporaries"]) for k in kills if k["phase"]),
        # the phase file's last line at the kill: "begin update" (inside it), "end refresh" (after it,
        # between phases: the step's bookkeeping, writes, checkpoint), "" (before the first phase: startup)
        "kills_by_phase": {p or "startup": sum(k["phase"] == p for k in kills) for p in sorted({k["phase"] for k in kills})},
        "kill_log": kills, "settings": [*overrides, *KILLED_RUN], "reference_seconds": round(reference_seconds, 1),
        "seconds": round(time.monotonic() - began, 1), "machine": platform.platform(), "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"kills-{args.kills}-seed{args.seed}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(kills)} kills over {len(rounds)} run(s), {missed} missed target(s); identical to the uninterrupted "
          f"run: {report['identical']}; {path}")
    if args.work is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
