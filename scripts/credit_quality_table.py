"""The credit-quality table of docs/studies/credit-quality.md from one or more `rredcot judge` outputs
(``credit_quality.parquet``, one row per method and batch): mean ± half-width of the 95% Student-t
interval over batches per column, then paired differences of two methods over the same batches.

    python scripts/credit_quality_table.py results/credit-quality/r4/credit_quality.parquet \
        [more.parquet ...] [--label FILE=SUFFIX ...] [--pair rredcot mc]

Several files judged on the same traces (e.g. a second judge run with ``run.tag``) are read as
one table; ``--label`` appends a suffix to the method names of one file (``rredcot`` judged with
``value=answer_probe`` in another run -> ``rredcot (answer_probe)``).
"""

from __future__ import annotations

import argparse
import math

import pyarrow.parquet as pq

from rredcot_cli.metrics import mean_ci

COLUMNS = [("value ρ", "value_spearman", 3), ("value r", "value_pearson", 3),
           ("value ρ inner", "value_spearman_inner", 3), ("credit ρ", "credit_spearman", 3),
           ("credit r", "credit_pearson", 3), ("first error", "first_error_rate", 2),
           ("chance", "first_error_chance", 2), ("adv std", "advantage_std", 3),
           ("forward tokens", "forward_tokens", 0), ("generated tokens", "generated_tokens", 0),
           ("seconds", "seconds", 1)]


def cell(values: list[float], digits: int, constant: bool = False) -> str:
    if not values:
        return "—"
    mean, low, high = mean_ci(values, 0.95)
    if constant and all(v == 0 for v in values):
        return "0.00 (const)"
    fmt = f",.{digits}f" if digits == 0 else f".{digits}f"
    if math.isnan(low) or len(set(values)) == 1:  # one batch, or the same on every batch (e.g. 0)
        return format(mean, fmt)
    return f"{format(mean, fmt)} ± {format((high - low) / 2, fmt)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--label", action="append", default=[], help="FILE=SUFFIX")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.label)
    rows = []
    for path in args.files:
        for row in pq.read_table(path).to_pylist():
            if path in labels:
                row["method"] = f"{row['method']} ({labels[path]})"
            rows.append(row)
    methods = sorted(dict.fromkeys(r["method"] for r in rows))
    print("| method | " + " | ".join(h for h, _, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for method in methods:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["batch"])
        constant = all(r["credit_constant"] for r in mine)
        cells = [cell([float(r[c]) for r in mine if r[c] is not None], d, constant and c == "first_error_rate")
                 for _, c, d in COLUMNS]
        print(f"| {method} | " + " | ".join(cells) + " |")
    for a, b in args.pair:
        print(f"\nPaired {a} − {b} over the same batches (mean, 95% interval):\n")
        print(f"| column | {a} per batch | {b} per batch | difference |\n|---|---|---|---|")
        left = {r["batch"]: r for r in rows if r["method"] == a}
        right = {r["batch"]: r for r in rows if r["method"] == b}
        batches = sorted(set(left) & set(right))
        for header, column, digits in COLUMNS[:6]:
            pairs = [(left[i][column], right[i][column]) for i in batches
                     if left[i][column] is not None and right[i][column] is not None]
            if not pairs:
                continue
            mean, low, high = mean_ci([x - y for x, y in pairs], 0.95)
            print(f"| {header} | {', '.join(f'{x:.2f}' for x, _ in pairs)} | {', '.join(f'{y:.2f}' for _, y in pairs)} "
                  f"| {mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] |")


if __name__ == "__main__":
    main()
