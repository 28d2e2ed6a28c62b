"""Write the packaged `arith` benchmark (rredcot_cli/data/arith/{train,test}.jsonl): short
arithmetic questions for a small pretrained instruct model, where SmolLM2-135M-Instruct's sampled
pass@1 has room both ways (docs/studies/real-model.md).

Every ordered pair (a, b) of single digits, as "a + b" and as "a - b" with a >= b (155 questions),
split 3:1 into train and test by a seeded shuffle, so the two splits share no question.

    python scripts/make_arith.py            # rewrites the packaged files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "rredcot_cli" / "data" / "arith"
QUESTION = "What is {a} {op} {b}? Answer with a single number."
SEED = 2027


def questions() -> list[dict]:
    rows = []
    for a in range(10):
        for b in range(10):
            rows.append({"question": QUESTION.format(a=a, op="+", b=b), "answer": str(a + b), "id": f"{a}+{b}"})
            if a >= b:
                rows.append({"question": QUESTION.format(a=a, op="-", b=b), "answer": str(a - b), "id": f"{a}-{b}"})
    return rows


def main() -> None:
    rows = questions()
    random.Random(SEED).shuffle(rows)
    cut = len(rows) * 3 // 4
    OUT.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows[:cut]), ("test", rows[cut:])):
        (OUT / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        print(f"{split}: {len(part)} questions -> {OUT / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()
