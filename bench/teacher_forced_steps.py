"""Which decisions of a chain line does a model get right, step by step, under teacher forcing?

For `chain` and `chain_verbose` test problems, the gold solution is fed to the model and its
greedy (argmax) prediction is checked at the decisive characters of every step line: the value
carried in, the operation, its operand and the result of the closing ``a<op>b=c``, and (for
`chain_verbose`) every character of the list of operations left. A per-token loss averages these
few characters with dozens of predictable ones; this table shows where a fine-tune actually fails
(e.g. an operand that is right up to step 4 and wrong after), before any sampling.

    python bench/teacher_forced_steps.py --model runs/x/sft/model --benchmark chain_verbose \
        --problems 64 --json results/long-chains/verbose-finetune/x-teacher-forced.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

import torch

CLOSING = re.compile(r"(\d)([+\-*])(\d)=(\d)\.?$")
FIELDS = ("value", "op", "operand", "result", "left")


def decisive_positions(line: str) -> dict[str, list[int]]:
    """Character offsets (within ``line``) of each decisive field; ``left`` only when present."""
    match = CLOSING.search(line)
    if match is None:
        raise ValueError(f"not a chain step line: {line!r}")
    out = {name: [match.start(i + 1)] for i, name in enumerate(FIELDS[:4])}
    if "left are " in line:
        start = line.index("left are ") + len("left are ")
        out["left"] = list(range(start, line.index(",", start)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--benchmark", default="chain_verbose", choices=["chain", "chain_verbose"])
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--min-steps", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--json", default=None, help="write the table here")
    args = parser.parse_args()

    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.policy.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()
    benchmark = make_benchmark(args.benchmark, min_steps=args.min_steps, max_steps=args.max_steps)
    wrong, total = Counter(), Counter()
    for problem in benchmark.load("test", args.problems):
        prompt = benchmark.prompt(problem)
        lines = benchmark.gold_lines(problem)
        text = prompt + "".join(line + "\n" for line in lines)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == len(text), "the character tokenizer maps one character to one token"
        with torch.no_grad():
            predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)
        offset = len(prompt)
        for step, line in enumerate(lines, start=1):
            for field, positions in decisive_positions(line).items():
                total[(step, field)] += 1
                if any(predicted[offset + p - 1].item() != ids[offset + p] for p in positions):
                    wrong[(step, field)] += 1
            offset += len(line) + 1

    steps = sorted({s for s, _ in total})
    fields = [f for f in FIELDS if any((s, f) in total for s in steps)]
    table = {str(s): {f: {"wrong": wrong[(s, f)], "lines": total[(s, f)]} for f in fields if (s, f) in total}
             for s in steps}
    print(f"{'step':>4}  " + "  ".join(f"{f:>10}" for f in fields) + "   (wrong / lines, argmax under teacher forcing)")
    for s in steps:
        print(f"{s:>4}  " + "  ".join(f"{wrong[(s, f)]:>4}/{total[(s, f)]:<5}" for f in fields))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"model": args.model, "benchmark": args.benchmark, "problems": args.problems,
                       "steps": [args.min_steps, args.max_steps], "table": table}, handle, indent=2)


if __name__ == "__main__":
    main()
