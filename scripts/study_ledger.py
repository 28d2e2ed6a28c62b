"""Every run of a study and the time it took: the ledger its closing note lists (issue 39).

    python scripts/study_ledger.py results/where-credit-pays            # a table per setting, then the totals
    python scripts/study_ledger.py results/where-credit-pays --json ledger.json

A run is a folder holding ``train/manifest.json`` (its ``rollouts/`` are parts of it, not runs). For
each: the setting, the block (``sweep/<arm>`` or ``runs``), its status, the commit it ran at, when it
started and finished, and from ``train/summary.json`` its ``seconds`` (wall) and ``cpu_seconds``
(both summed over a resumed run's attempts), and how many attempts it took (1 plus the restarts its
manifest lists under ``resumed``). An attempt that was stopped counts up to its last checkpoint: the
steps it made after that were made again by the next attempt and are in no figure, so a run's seconds
understate the machine time it took by at most ``train.save_every`` steps per restart. Then, per
setting, the totals in core-hours beside the budget registered in the study's ``protocol.json``
(section 1.3 of docs/studies/where-credit-pays.md counts a run's wall seconds as its core-hours, one
thread each; CPU hours are shown beside them, and are the smaller figure on a shared machine).

Attempts lost with their machine (a run folder that lived only on a machine since replaced) left no
manifest. The study's ``lost_attempts.csv``, written by hand from its run log, lists each: setting,
block, run, its state when last seen (``complete`` or ``running``), when it began (if known), when it
was last seen and when the loss was found, and the run-log entry that tells it. The ledger lists them
and counts them per setting; it does not time them (their summaries were lost too).

Runs made at the registered commits do not record their CPU in their manifests, and the same run made
on another kind of CPU gives other numbers (docs/failure-modes.md, Determinism). The study's
``machines.csv``, also from its run log, lists each machine the study ran on with when it was booted;
a run's machine is the last one booted before the run was created (a run is never resumed across
machines: its checkpoints go with the machine). The ledger names each run's machine and lists the
pairs of main runs (the same seed, both arms) whose arms ran on different machines.

Last, per registered setting, what is left of its primary blocks and the core-hours it would take
at the mean wall seconds of the finished runs: a projection from times alone, for planning sessions.

Nothing but manifests and the two timing fields of each summary is read, so the ledger can be drawn
while a study runs without an interim look at its results.
"""

import argparse
import csv
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunEntry:
    setting: str
    block: str  # "sweep/<arm>" or "runs"
    name: str
    status: str
    commit: str | None
    started: str | None
    finished: str | None
    seconds: float | None  # wall seconds of the run (None until it finishes)
    cpu_seconds: float | None
    attempts: int  # 1 + the restarts that resumed it from a checkpoint
    machine: str = ""  # from the study's machines.csv ("" when it has none)


@dataclass(frozen=True)
class LostAttempt:
    setting: str
    block: str
    run: str
    state_when_last_seen: str  # "complete" or "running"
    began_utc: str  # "" when not known
    last_seen_utc: str
    lost_by_utc: str
    run_log_entry: str


LOST_ATTEMPTS = "lost_attempts.csv"
MACHINES = "machines.csv"
MACHINE_COLUMNS = ["machine", "booted_utc", "cpu", "cores", "torch_cpu_capability", "run_log_entry"]


class LedgerError(ValueError):
    """A study folder the ledger cannot read; the message names the fix."""


def _table(path: Path, columns: list[str]) -> list[dict]:
    """The rows of a hand-written CSV (none if there is no such file); its header must be ``columns``."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != columns:
            raise LedgerError(f"{path} has the columns {reader.fieldnames}; its header must be {','.join(columns)}")
        return list(reader)


def lost_attempts(study: Path) -> list[LostAttempt]:
    """The attempts listed in ``study/lost_attempts.csv`` (none if there is no such file)."""
    return [LostAttempt(**row) for row in _table(study / LOST_ATTEMPTS, list(LostAttempt.__dataclass_fields__))]


def machines(study: Path) -> list[dict]:
    """The machines listed in ``study/machines.csv``, in the order they were booted (an empty
    ``booted_utc``, allowed first only, stands for "before every other")."""
    rows = _table(study / MACHINES, MACHINE_COLUMNS)
    booted = [row["booted_utc"] for row in rows]
    if any(not b for b in booted[1:]) or booted != sorted(booted):
        raise LedgerError(f"{study / MACHINES}: list the machines in the order they were booted, "
                          "with an empty booted_utc on the first row only")
    return rows


def machine_at(rows: list[dict], created: str | None) -> str:
    """The machine last booted before ``created`` (an ISO time; compared at minute precision)."""
    if not created:
        return ""
    minute = created[:16]
    return next((row["machine"] for row in reversed(rows) if row["booted_utc"][:16] <= minute), "")


def pairs_across_machines(entries: list[RunEntry]) -> list[tuple[str, str, list[str]]]:
    """Main runs of the same setting and seed made on different machines: (setting, seed, the runs
    as ``name (machine)``). Only runs with a known machine count."""
    by_pair: dict[tuple[str, str], list[RunEntry]] = {}
    for e in entries:
        seed = re.search(r"-seed(\d+)$", e.name)
        if e.block == "runs" and seed and e.machine:
            by_pair.setdefault((e.setting, seed.group(1)), []).append(e)
    return [(setting, seed, [f"{e.name} ({e.machine})" for e in runs])
            for (setting, seed), runs in sorted(by_pair.items(), key=lambda kv: (kv[0][0], int(kv[0][1])))
            if len({e.machine for e in runs}) > 1]


def ledger(study: Path) -> list[RunEntry]:
    """Every run under ``study/<setting>/``, sorted by setting, block and name."""
    known_machines = machines(study)
    entries = []
    for manifest_path in sorted(study.glob("*/**/train/manifest.json")):
        run = manifest_path.parent.parent
        rel = run.relative_to(study)
        if "rollouts" in rel.parts or "checkpoints" in rel.parts:
            continue
        manifest = json.loads(manifest_path.read_text())
        summary_path = run / "train" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        entries.append(RunEntry(
            setting=rel.parts[0], block="/".join(rel.parts[1:-1]), name=rel.parts[-1],
            status=manifest.get("status", "unknown"), commit=(manifest.get("git") or {}).get("sha"),
            started=manifest.get("created"), finished=manifest.get("finished"),
            seconds=summary.get("seconds"), cpu_seconds=summary.get("cpu_seconds"),
            attempts=1 + len(manifest.get("resumed", [])),
            machine=machine_at(known_machines, manifest.get("created")),
        ))
    return entries


def totals(entries: list[RunEntry], protocol: dict, lost: list[LostAttempt] = ()) -> list[dict]:
    """Per setting: runs by status, attempts lost with a machine, wall and CPU core-hours, and the
    registered budget."""
    out = []
    for setting in sorted({e.setting for e in entries} | {a.setting for a in lost}):
        mine = [e for e in entries if e.setting == setting]
        budget = protocol.get("settings", {}).get(setting, {}).get("cpu_budget_core_hours", {})
        out.append({
            "setting": setting,
            "runs": len(mine),
            "complete": sum(e.status == "complete" for e in mine),
            "lost_attempts": sum(a.setting == setting for a in lost),
            "wall_core_hours": round(sum(e.seconds or 0.0 for e in mine) / 3600, 2),
            "cpu_hours": round(sum(e.cpu_seconds or 0.0 for e in mine) / 3600, 2),
            "budget_primary": budget.get("primary"),
            "budget_total": budget.get("total"),
        })
    return out


def remaining(entries: list[RunEntry], protocol: dict) -> list[dict]:
    """Per registered setting, its primary blocks: the registered runs (sweep: arms x rates x tuning
    seeds; main: arms x evaluation seeds), how many are complete, and the core-hours the rest would
    take at the mean wall seconds of the setting's finished runs of the same block (the sweep's mean
    for main runs until one finishes). A projection from times alone, for planning."""
    out = []
    for setting, spec in protocol.get("settings", {}).items():
        if spec.get("status") != "registered":
            continue
        arms, sweep = list(spec["arms"]), spec["lr_sweep"]
        done = [e for e in entries if e.setting == setting and e.status == "complete" and e.seconds is not None]
        sweep_done = [e for e in done if e.block in {f"sweep/{arm}" for arm in arms}]
        main_done = [e for e in done if e.block == "runs" and any(e.name.startswith(f"{arm}-lr") for arm in arms)]
        sweep_left = len(arms) * len(sweep["lrs"]) * len(sweep["tuning_seeds"]) - len(sweep_done)
        main_left = len(arms) * len(spec["eval_seeds"]) - len(main_done)
        sweep_mean = sum(e.seconds for e in sweep_done) / len(sweep_done) if sweep_done else None
        main_mean = sum(e.seconds for e in main_done) / len(main_done) if main_done else sweep_mean
        projected = None
        if (sweep_left == 0 or sweep_mean is not None) and (main_left == 0 or main_mean is not None):
            projected = round((sweep_left * (sweep_mean or 0.0) + main_left * (main_mean or 0.0)) / 3600, 1)
        out.append({"setting": setting, "sweep_left": sweep_left, "main_left": main_left,
                    "projected_core_hours": projected})
    return out


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _budget(row: dict) -> str:
    return "" if row["budget_primary"] is None else f"{row['budget_primary']} / {row['budget_total']}"


def markdown(entries: list[RunEntry], sums: list[dict], lost: list[LostAttempt] = (), left: list[dict] = ()) -> str:
    lines = ["| setting | block | run | status | commit | started (UTC) | machine | attempts | wall s | CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        lines.append(f"| {e.setting} | {e.block} | {e.name} | {e.status} | {(e.commit or '')[:7]} | "
                     f"{(e.started or '')[:16].replace('T', ' ')} | {e.machine} | {e.attempts} | {_num(e.seconds)} | "
                     f"{_num(e.cpu_seconds)} |")
    across = pairs_across_machines(entries)
    if across:
        lines += ["", f"Pairs of main runs made on different machines (from {MACHINES}):", ""]
        lines += [f"- {setting}, seed {seed}: {', '.join(runs)}" for setting, seed, runs in across]
    if lost:
        lines += ["", f"Attempts lost with their machine (no manifest survived; from {LOST_ATTEMPTS}):", "",
                  "| setting | block | run | state when last seen | began (UTC) | last seen (UTC) | lost by (UTC) |",
                  "|---|---|---|---|---|---|---|"]
        for a in lost:
            lines.append(f"| {a.setting} | {a.block} | {a.run} | {a.state_when_last_seen} | "
                         f"{a.began_utc.replace('T', ' ')} | {a.last_seen_utc.replace('T', ' ')} | "
                         f"{a.lost_by_utc.replace('T', ' ')} |")
    lines += ["", "| setting | runs | complete | lost attempts | wall core-hours | CPU hours | budget (primary / total) |",
              "|---|---|---|---|---|---|---|"]
    for s in sums:
        lines.append(f"| {s['setting']} | {s['runs']} | {s['complete']} | {s['lost_attempts']} | "
                     f"{s['wall_core_hours']:.2f} | {s['cpu_hours']:.2f} | {_budget(s)} |")
    if left:
        lines += ["", "What is left of the primary blocks (a projection from the finished runs' wall seconds):", "",
                  "| setting | sweep runs left | main runs left | projected core-hours |", "|---|---|---|---|"]
        for r in left:
            projected = "" if r["projected_core_hours"] is None else f"{r['projected_core_hours']:.1f}"
            lines.append(f"| {r['setting']} | {r['sweep_left']} | {r['main_left']} | {projected} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the study's folder, e.g. results/where-credit-pays")
    parser.add_argument("--protocol", type=Path, help="its protocol.json (default: STUDY/protocol.json)")
    parser.add_argument("--json", type=Path, help="also write the ledger and the totals here")
    args = parser.parse_args(argv)
    if not args.study.is_dir():
        print(f"error: {args.study} is not a folder; pass the study's results folder, e.g. results/where-credit-pays",
              file=sys.stderr)
        return 2
    protocol_path = args.protocol or args.study / "protocol.json"
    protocol = json.loads(protocol_path.read_text()) if protocol_path.is_file() else {}
    try:
        lost = lost_attempts(args.study)
        entries = ledger(args.study)
    except LedgerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sums = totals(entries, protocol, lost)
    left = remaining(entries, protocol)
    print(markdown(entries, sums, lost, left), end="")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        across = [{"setting": setting, "seed": int(seed), "runs": runs} for setting, seed, runs in pairs_across_machines(entries)]
        args.json.write_text(json.dumps({"runs": [asdict(e) for e in entries], "lost_attempts": [asdict(a) for a in lost],
                                         "pairs_across_machines": across, "totals": sums, "remaining": left}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
