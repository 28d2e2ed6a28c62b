"""Whether two `rredcot train` run folders hold the same numbers, value for value: for checking
that a refactor changes nothing (issue 40: same seed, same machine, same metrics and evals).

    python scripts/same_run.py RUN_A RUN_B
    python scripts/same_run.py --no-weights RUN results/...  # a committed run: kept without its checkpoints

Compares every Parquet artifact under train/ (metrics.parquet without its wall-clock ``seconds*``
columns, eval.parquet, the saved rollouts), the summary's evals and counts, and every tensor of the
final checkpoint (model.safetensors, and critic.pt where PPO wrote one). NaN equals NaN; nothing
else is approximate. Prints one line per run pair and the first differences; exit status 1 when
anything differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file

SUMMARY_KEYS = ("steps", "generated_tokens", "skipped_updates", "eval_before", "eval_after")


def _rows(path: Path) -> list[dict]:
    table = pq.read_table(path)
    return table.drop([c for c in table.column_names if c.startswith("seconds")]).to_pylist()


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _artifacts(train: Path) -> list[str]:
    """Parquet artifacts under ``train``: files, and folders of parts (metrics.parquet) as one."""
    found = {p.relative_to(train).as_posix() for p in train.rglob("*.parquet") if not p.parent.name.endswith(".parquet")}
    return sorted(found)


def _tensors(final: Path) -> dict[str, torch.Tensor]:
    tensors = dict(load_file(final / "model.safetensors"))
    if (final / "critic.pt").exists():
        tensors |= {f"critic.{k}": v for k, v in _flat(torch.load(final / "critic.pt", map_location="cpu")).items()}
    return tensors


def _flat(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
        elif isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
    return out


def differences(run_a: Path, run_b: Path, weights: bool = True) -> tuple[list[str], int]:
    """What differs between the two runs, and how many values were compared (the final weights
    too unless ``weights`` is false)."""
    a, b = Path(run_a) / "train", Path(run_b) / "train"
    found, compared = [], 0
    names_a, names_b = _artifacts(a), _artifacts(b)
    if names_a != names_b:
        found.append(f"artifacts differ: {sorted(set(names_a) ^ set(names_b))}")
    for name in sorted(set(names_a) & set(names_b)):
        rows_a, rows_b = _rows(a / name), _rows(b / name)
        if len(rows_a) != len(rows_b):
            found.append(f"{name}: {len(rows_a)} vs {len(rows_b)} rows")
            continue
        for i, (x, y) in enumerate(zip(rows_a, rows_b)):
            for key in x.keys() | y.keys():
                compared += 1
                if not _same(x.get(key), y.get(key)):
                    found.append(f"{name} row {i} {key}: {x.get(key)!r} vs {y.get(key)!r}")
    summary_a, summary_b = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    found += [f"summary.json {k}: {summary_a.get(k)} vs {summary_b.get(k)}" for k in SUMMARY_KEYS
              if summary_a.get(k) != summary_b.get(k)]
    if not weights:
        return found, compared
    tensors_a, tensors_b = (_tensors(d / "checkpoints" / "final") for d in (a, b))
    if tensors_a.keys() != tensors_b.keys():
        found.append(f"checkpoint tensors differ: {sorted(tensors_a.keys() ^ tensors_b.keys())}")
    for key in sorted(tensors_a.keys() & tensors_b.keys()):
        compared += 1
        if not torch.equal(tensors_a[key], tensors_b[key]):
            gap = float((tensors_a[key].float() - tensors_b[key].float()).abs().max())
            found.append(f"weight {key}: max |difference| {gap:.3g}")
    return found, compared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--no-weights", action="store_true",
                        help="compare everything but the final weights (committed runs are kept without checkpoints)")
    args = parser.parse_args(argv)
    for run in (args.run_a, args.run_b):
        if not (run / "train" / "summary.json").exists():
            print(f"error: {run} is not a finished run folder (no train/summary.json)", file=sys.stderr)
            return 2
    if not args.no_weights:
        for run in (args.run_a, args.run_b):
            if not (run / "train" / "checkpoints" / "final" / "model.safetensors").exists():
                print(f"error: {run} has no train/checkpoints/final/model.safetensors to compare; pass --no-weights "
                      "to compare the rest (committed runs are kept without their checkpoints)", file=sys.stderr)
                return 2
    found, compared = differences(args.run_a, args.run_b, weights=not args.no_weights)
    print(f"{args.run_a} vs {args.run_b}: {compared} values compared, "
          + ("identical" if not found else f"{len(found)} differ"))
    for line in found[:20]:
        print(f"  {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
