"""Copy a study's finished runs from the tree that runs it into another tree, to be committed as they finish.

    python scripts/keep_finished_runs.py <worktree>/results/where-credit-pays/A results/where-credit-pays/A

Why: a study's drivers run for days from worktrees pinned at the registration's commit, and the
machine under them can be replaced between working sessions. Run folders kept only in those trees are
then lost (issue 39 lost every finished run that way on 2026-12-07). Copying each run into the main
checkout once its manifest says ``complete``, and committing it, bounds a loss to the runs in flight.

What is copied, from SRC to the same relative path under DST:

- every run folder (a folder holding ``train/manifest.json``) whose manifest's status is
  ``complete``, without ``checkpoints/`` and lock files;
- ``logs/<name>.log`` beside a finished run folder ``<name>`` (the sweep's per-run logs);
- every other file outside run folders and ``logs/``: the sweep's records, the further-arm decision,
  ``failed_runs.txt``, the verdicts.

Unfinished runs and their logs are left alone, and a file already at DST with the same bytes is
skipped. A run's file at DST with other bytes is an error and is not overwritten (a finished run never
changes); a record outside the runs with other bytes is replaced by SRC's and listed (``failed_runs.txt``
grows as runs fail). A sweep log is a history that only grows: SRC's replaces DST's when it begins with
DST's bytes, and otherwise DST's is kept and listed, because a sweep rerun at a commit before
``scripts/lr_sweep.py`` appended to its logs rewrote a finished run's log to the one line "up to date".
Nothing is read from a run but its manifest's status: copying is not looking. The same command with
SRC and DST swapped puts the committed runs back into a fresh worktree, where the driver then skips
them.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
from pathlib import Path

SKIPPED_DIRS = {"checkpoints"}
SKIPPED_NAMES = {".rredcot.lock"}


def run_folders(root: Path) -> dict[Path, bool]:
    """Every run folder under ``root`` (relative path -> finished), a run folder holding ``train/manifest.json``."""
    runs: dict[Path, bool] = {}
    for manifest in sorted(root.glob("**/train/manifest.json")):
        run = manifest.parent.parent
        if any(part in SKIPPED_DIRS for part in run.relative_to(root).parts):
            continue
        try:
            finished = json.loads(manifest.read_text()).get("status") == "complete"
        except (OSError, ValueError):
            finished = False  # a manifest being written is not finished
        runs[run.relative_to(root)] = finished
    return runs


def files_to_keep(root: Path) -> list[Path]:
    """The files under ``root`` (relative paths) that belong to finished runs or to no run at all."""
    runs = run_folders(root)
    finished_names = {(run.parent, run.name) for run, done in runs.items() if done}
    keep = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if path.name in SKIPPED_NAMES or any(part in SKIPPED_DIRS for part in rel.parts[:-1]):
            continue
        owner = next((run for run in runs if rel.is_relative_to(run)), None)
        if owner is not None:
            if runs[owner]:
                keep.append(rel)
            continue
        if rel.parent.name == "logs" and rel.suffix == ".log":
            if (rel.parent.parent, rel.stem) in finished_names:
                keep.append(rel)
            continue
        keep.append(rel)
    return keep


def copy_kept(src: Path, dst: Path) -> tuple[list[Path], list[Path], list[Path], list[Path]]:
    """Copy ``files_to_keep(src)`` into ``dst``: (copied, replaced records and grown logs, conflicting run
    files, logs kept at ``dst`` because ``src``'s was rewritten), relative paths."""
    runs = run_folders(src)
    copied, replaced, conflicts, kept_logs = [], [], [], []
    for rel in files_to_keep(src):
        target = dst / rel
        if target.exists():
            if filecmp.cmp(src / rel, target, shallow=False):
                continue
            if any(rel.is_relative_to(run) for run in runs):
                conflicts.append(rel)
                continue
            if rel.parent.name == "logs" and not (src / rel).read_bytes().startswith(target.read_bytes()):
                kept_logs.append(rel)
                continue
            replaced.append(rel)
        else:
            copied.append(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)
    return copied, replaced, conflicts, kept_logs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a setting's folder in the tree that runs the study")
    parser.add_argument("dst", type=Path, help="the same setting's folder in the tree to commit from")
    args = parser.parse_args(argv)
    if not args.src.is_dir():
        print(f"error: {args.src} is not a folder; pass a setting's results folder, e.g. "
              "<worktree>/results/where-credit-pays/A", file=sys.stderr)
        return 2
    copied, replaced, conflicts, kept_logs = copy_kept(args.src, args.dst)
    runs = run_folders(args.src)
    print(f"{args.src} -> {args.dst}: {sum(runs.values())} finished runs of {len(runs)}, "
          f"{len(copied)} files copied, {len(replaced)} records replaced, {len(conflicts)} conflicting")
    for rel in replaced:
        print(f"replaced {args.dst / rel} by the newer {args.src / rel}")
    for rel in kept_logs:
        print(f"kept {args.dst / rel}: {args.src / rel} does not begin with it (a sweep rerun rewrote it)")
    for rel in conflicts:
        print(f"error: {args.dst / rel} differs from {args.src / rel}; not overwritten (compare the two "
              "and remove the wrong one)", file=sys.stderr)
    return 1 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
