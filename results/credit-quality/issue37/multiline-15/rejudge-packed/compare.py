"""Batches 1-5 of the multi-line judge, answer_probe, re-judged after the packed probe scorer
(ea55fc9) against the committed tables judged before it: every metric column of every row
(timings and position counts aside), and the inputs' hashes. Run from the repository root."""

import json
import math
import sys

import pyarrow.parquet as pq

BEFORE = "results/credit-quality/issue37/multiline-15/judge"
AFTER = sys.argv[1] if len(sys.argv) > 1 else "runs/rejudge"
COST = {"seconds", "seconds_vs_sample", "forward_tokens", "generated_tokens", "backward_tokens"}


def table(path):
    return pq.read_table(f"{path}/judge-answer-probe/credit_quality.parquet").to_pylist()


def manifest(path):
    return json.load(open(f"{path}/judge-answer-probe/manifest.json"))


def differs(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return not (a == b or (math.isnan(a) and math.isnan(b)))
    return a != b


result = {"before": BEFORE, "after": AFTER, "batches": []}
for b in range(1, 6):
    before, after = f"{BEFORE}/b{b}", f"{AFTER}/jd-b{b}"
    mb, ma = manifest(before), manifest(after)
    rows_b, rows_a = table(before), table(after)
    assert [r["method"] for r in rows_b] == [r["method"] for r in rows_a]
    changed = [{"method": rb["method"], "column": k, "before": rb[k], "after": ra[k]}
               for rb, ra in zip(rows_b, rows_a) for k in rb if k not in COST | {"method", "batch"} and differs(rb[k], ra[k])]
    rredcot_b = next(r for r in rows_b if r["method"] == "rredcot")
    rredcot_a = next(r for r in rows_a if r["method"] == "rredcot")
    result["batches"].append({
        "batch": b, "commit_before": mb["git"]["sha"][:7], "commit_after": ma["git"]["sha"][:7],
        "same_inputs": all(mb["inputs"][k]["sha256"] == ma["inputs"][k]["sha256"] for k in ("samples", "segments")),
        "metric_values_compared": sum(1 for r in rows_b for k in r if k not in COST | {"method", "batch"}),
        "changed": changed,
        "rredcot_forward_tokens": [rredcot_b["forward_tokens"], rredcot_a["forward_tokens"]],
        "rredcot_seconds": [round(rredcot_b["seconds"], 1), round(rredcot_a["seconds"], 1)]})
result["max_abs_change"] = max((abs(c["after"] - c["before"]) for b in result["batches"] for c in b["changed"]), default=0.0)
result["changed_columns"] = sorted({c["column"] for b in result["batches"] for c in b["changed"]})
print(json.dumps(result, indent=1))
