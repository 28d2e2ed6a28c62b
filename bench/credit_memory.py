"""Peak memory and time of RREDCoT's credit phase (``suffix_is`` probes) at a real vocabulary.

Builds a random-init model from a shipped ``config.json`` (bench/configs/, no hub; depth reduced
with ``--layers``: memory of the logits does not depend on depth), one group of ``--samples``
random traces (``--prompt`` + ``--completion`` tokens, ``--segments`` equal segments, half the group
rewarded), and runs ``suffix_is_values`` with the method's defaults (matched boundaries, a window of
one segment, self-normalised, clip 20) and the KV-cache probe scorer. Records the resident
high-water mark of that call above the resident set before it (VmHWM, reset through
/proc/self/clear_refs; glibc is told to mmap every allocation of 128 KiB or more, so RSS follows
live tensors), its wall and CPU seconds, the forward positions, the values (to compare two trees),
and which ``rredcot_cli`` was imported, so the same command run against two checkouts
(``PYTHONPATH=<checkout>``) compares them:

    python bench/credit_memory.py --label after --out results/memory/credit-memory/after.json
    PYTHONPATH=/tmp/before python bench/credit_memory.py --label before --out results/memory/credit-memory/before.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from measure import proc_status, reset_peak_rss

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="qwen2.5-0.5b-instruct", help="a folder of bench/configs/")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--completion", type=int, default=320)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
        os.execv(sys.executable, [sys.executable, *sys.argv])

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import rredcot_cli
    from rredcot_cli.values.suffix_is import suffix_is_values

    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(HERE / "configs" / args.config)
    config.num_hidden_layers = args.layers
    model = AutoModelForCausalLM.from_config(config).eval()
    g = torch.Generator().manual_seed(args.seed)
    n, P, T, S = args.samples, args.prompt, args.completion, args.segments
    prompt = torch.randint(0, config.vocab_size, (P,), generator=g).tolist()
    traces = [prompt + torch.randint(0, config.vocab_size, (T,), generator=g).tolist() for _ in range(n)]
    boundaries = [[k * T // S for k in range(S)] for _ in range(n)]
    sampling = [(-torch.rand(T, generator=g) * 3).tolist() for _ in range(n)]
    rewards = [float(i % 2) for i in range(n)]
    stats: dict = {}
    reset_peak_rss()
    rss_before = proc_status("VmRSS")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    values = suffix_is_values(model, traces, [P] * n, boundaries, sampling, rewards, [0] * n, matched=True, window=1,
                              window_unit="segments", self_normalised=True, clip=20.0, stats=stats)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    peak = proc_status("VmHWM")
    tree = Path(rredcot_cli.__file__).resolve().parent.parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    record = {
        "label": args.label, "rredcot_cli": str(tree), "commit": commit, "argv": sys.argv[1:],
        "model": args.config, "layers": args.layers, "vocab": config.vocab_size, "hidden": config.hidden_size,
        "traces": n, "prompt_tokens": P, "completion_tokens": T, "segments": S,
        "forward_positions": stats.get("forward_tokens"),
        "peak_above_start_mib": round((peak - rss_before) / 2**20, 1), "rss_before_mib": round(rss_before / 2**20, 1),
        "wall_s": round(wall, 2), "cpu_s": round((after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime), 2),
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "values": [[round(float(x), 6) for x in v] for v in values],
    }
    print(json.dumps({k: v for k, v in record.items() if k != "values"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
