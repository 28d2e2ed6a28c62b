"""Where a long decode step goes: the attention reads of the KV cache against the memory bandwidth.

At the decode bench's *long* case (64 rows, ~400-token prompts, ~950-token completions; the
embedded model: 6 layers, 4 heads of 32, fp32) every decode step reads every row's keys and
values. This times, on one thread:

- ``read``: a sum over a 512 MB fp32 tensor (the single-thread read bandwidth);
- ``sdpa``: torch's scaled_dot_product_attention for one new token per row over L cached positions
  (the cache laid out as the HF backend's growing cache: views of a larger store), for L from the
  default length (~100) to the long case (~1,400), x 6 layers = one decode step's attention;

and prints JSON (``--out`` writes it). Compare the attention time per step with the bench's
measured time per decode step (64 rows / tokens per s) to see how much of the step the KV reads
are. Run on a quiet machine: ``python bench/decode_attention.py --out results/throughput/decode_attention.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--lengths", default="100,400,800,1000,1200,1400")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    big = torch.ones(128 * 2**20)  # 512 MB
    read_s = timed(lambda: big.sum(), 5)
    result = {"torch": torch.__version__, "threads": 1, "read_gb_per_s": big.numel() * 4 / read_s / 1e9, "sdpa": []}
    del big
    capacity = 2048
    for length in map(int, args.lengths.split(",")):
        store_k = torch.randn(args.rows, args.heads, capacity, args.head_dim)
        store_v = torch.randn_like(store_k)
        k, v = store_k[:, :, :length], store_v[:, :, :length]
        q = torch.randn(args.rows, args.heads, 1, args.head_dim)
        mask = torch.ones(args.rows, 1, 1, length, dtype=torch.bool)
        per_layer = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 20)
        kv_bytes = 2 * k.numel() * 4
        result["sdpa"].append({"positions": length, "ms_per_step": 1e3 * per_layer * args.layers,
                               "kv_mb_per_step": kv_bytes * args.layers / 1e6,
                               "gb_per_s": kv_bytes / per_layer / 1e9})
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
