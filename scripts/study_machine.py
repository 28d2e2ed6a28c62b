"""Add this machine to a study's machines.csv unless it is there already.

    python scripts/study_machine.py results/where-credit-pays/machines.csv

Why: the runs a study makes at its registered commits do not record their CPU, and the same run made
on another kind of CPU gives other numbers (docs/failure-modes.md, Determinism). The study's
machines.csv lists each machine it ran on with when it was booted; scripts/study_ledger.py names
each run's machine from it (the last booted before the run was created). A machine booted within two
minutes of the last row's time is that row's machine; otherwise a row is appended, named by the boot
day and a letter (``2026-12-07c``), to be committed with the run log's entry that tells of it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import sys
import time
from pathlib import Path

COLUMNS = ["machine", "booted_utc", "cpu", "cores", "torch_cpu_capability", "run_log_entry"]
SAME_BOOT_SECONDS = 120


def this_machine() -> dict:
    """This machine's boot time (UTC, to the minute), CPU model, cores and torch's CPU capability."""
    import torch  # deferred: only the command needs it, the tests pass a machine of their own

    now = datetime.datetime.now(datetime.timezone.utc)
    booted = now - datetime.timedelta(seconds=time.clock_gettime(time.CLOCK_BOOTTIME))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    return {"booted": booted, "now": now, "cpu": cpu, "cores": os.cpu_count(),
            "capability": torch.backends.cpu.get_cpu_capability()}


def note_machine(path: Path, machine: dict) -> tuple[str, bool]:
    """The row name of ``machine`` in ``path``, and whether it was appended just now."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise ValueError(f"{path} has the columns {reader.fieldnames}; its header must be {','.join(COLUMNS)}")
        rows = list(reader)
    booted = machine["booted"]
    last = rows[-1]["booted_utc"] if rows else ""
    if last:
        last_boot = datetime.datetime.fromisoformat(last).replace(tzinfo=datetime.timezone.utc)
        if abs((booted - last_boot).total_seconds()) <= SAME_BOOT_SECONDS:
            return rows[-1]["machine"], False
    day = booted.strftime("%Y-%m-%d")
    name = day + "abcdefghijklmnopqrstuvwxyz"[sum(row["machine"].startswith(day) for row in rows)]
    with path.open("a", newline="") as f:
        csv.writer(f, lineterminator="\n").writerow(
            [name, booted.strftime("%Y-%m-%dT%H:%M"), machine["cpu"], machine["cores"], machine["capability"],
             machine["now"].strftime("%Y-%m-%d %H:%M")])
    return name, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("machines_csv", type=Path, help="the study's machines.csv, e.g. results/where-credit-pays/machines.csv")
    args = parser.parse_args(argv)
    if not args.machines_csv.is_file():
        print(f"error: {args.machines_csv} is not a file; pass the study's machines.csv "
              "(its header: " + ",".join(COLUMNS) + ")", file=sys.stderr)
        return 2
    machine = this_machine()
    try:
        name, added = note_machine(args.machines_csv, machine)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    described = f"{machine['cpu']}, {machine['cores']} cores, torch CPU capability {machine['capability']}"
    if added:
        print(f"machine: new, {name} added to {args.machines_csv} ({described}); commit it with the run log's entry")
    else:
        print(f"machine: {name} of {args.machines_csv} ({described})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
