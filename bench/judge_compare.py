"""Value estimators side by side from several `rredcot judge` tables on the same traces and batches
(issue 37 item 4): each estimator's key columns with their 95% interval over batches, and its paired
difference from each control on the batches where both are defined.

    python bench/judge_compare.py answer_probe=runs/jd/judge-answer-probe/credit_quality.parquet \
        suffix_is=runs/jd/judge-suffix-is/credit_quality.parquet ... [--out FILE.json]

The rredcot row of each table is named by its label; the controls and grpo come from the first.
A label may name several tables, comma-separated (label=a.parquet,b.parquet): judges of disjoint
prompt groups run side by side (each judge.batches=1, or more), whose batches are numbered on in
the order given, so that they read as one judge with their batches together.
"""

from __future__ import annotations

import argparse
import json
import math

import pyarrow.parquet as pq

from rredcot_cli.metrics import mean_ci

COLUMNS = ("value_spearman", "value_spearman_inner", "value_mse_inner", "value_spearman_within", "credit_spearman",
           "credit_spearman_within", "advantage_spearman_within", "value_coverage")
CONTROLS = ("control:outcome", "control:baseline")


def per_batch(paths: str) -> dict[str, dict[int, dict]]:
    rows: dict[str, dict[int, dict]] = {}
    offset = 0
    for path in paths.split(","):
        table = pq.read_table(path).to_pylist()
        for row in table:
            rows.setdefault(row["method"], {})[offset + row["batch"]] = row
        offset += 1 + max(row["batch"] for row in table)
    return rows


def summary(values: list[float]) -> dict:
    defined = [v for v in values if v is not None and not math.isnan(v)]
    if not defined:
        return {"batches": 0}
    mean, low, high = mean_ci(defined)
    return {"mean": mean, "low": None if math.isnan(low) else low, "high": None if math.isnan(high) else high,
            "batches": len(defined)}


def compare(tables: dict[str, str]) -> dict:
    rows = {}
    first = per_batch(next(iter(tables.values())))
    named = {label: per_batch(path)["rredcot"] for label, path in tables.items()}
    named.update({name: first[name] for name in (*CONTROLS, "grpo") if name in first})
    for label, batches in named.items():
        rows[label] = {col: summary([b.get(col) for b in batches.values()]) for col in COLUMNS}
    diffs = {}
    for label in tables:
        for control in CONTROLS:
            for col in ("value_spearman_inner", "value_mse_inner", "value_spearman_within"):
                pairs = [named[label][b].get(col) - named[control][b].get(col) for b in named[label]
                         if b in named[control] and named[label][b].get(col) is not None
                         and named[control][b].get(col) is not None]
                diffs[f"{label} - {control}: {col}"] = summary(pairs)
    return {"rows": rows, "paired_differences": diffs}


def fmt(s: dict, digits: int = 3) -> str:
    if not s.get("batches"):
        return "—"
    if s["low"] is None:
        return f"{s['mean']:.{digits}f} (1 batch)"
    return f"{s['mean']:.{digits}f} [{s['low']:.{digits - 1}f}, {s['high']:.{digits - 1}f}] ({s['batches']})"


# The table's columns: (header, column, digits); MSE (lower is better) needs more digits.
TABLE = (("value ρ", "value_spearman", 3), ("value ρ inner", "value_spearman_inner", 3),
         ("value MSE inner", "value_mse_inner", 4), ("value ρ \\| R", "value_spearman_within", 3),
         ("credit ρ", "credit_spearman", 3), ("adv ρ \\| R", "advantage_spearman_within", 3),
         ("coverage", "value_coverage", 3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tables", nargs="+", help="label=credit_quality.parquet")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = compare(dict(t.split("=", 1) for t in args.tables))
    print("| values | " + " | ".join(header for header, _, _ in TABLE) + " |")
    print("|---" * (len(TABLE) + 1) + "|")
    for label, cols in result["rows"].items():
        print(f"| {label} | " + " | ".join(fmt(cols[c], digits) for _, c, digits in TABLE) + " |")
    print()
    for key, s in result["paired_differences"].items():
        print(f"{key}: {fmt(s, 4 if 'mse' in key else 3)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
