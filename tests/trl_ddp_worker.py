"""One rank of ``SegmentCreditGRPOTrainer`` under torchrun, for tests/methods/test_oracle_trl_ddp.py.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/trl_ddp_worker.py OUT_DIR METHOD...

For each METHOD a 2-step run (plain ``generate``, CPU, gloo: accelerate picks gloo for
``use_cpu=True`` under torchrun) on the shipped tiny-chain model. Every rank writes
``OUT_DIR/METHOD-rank-R.pt``: per generation batch, what this rank had on its own (its prompt and
completion token ids and texts, the rewards its reward function returned, its gold answers), the
(B, T) advantages TRL's loss then got from the integration, TRL's own (B,) advantages of the same
batch, and the model's weights at that moment; rank 0 adds TRL's log history. The test rebuilds the
whole batch from the ranks' own rows, so nothing the integration gathered is taken on trust.

Per process: 6 completions of 4 generations each, so the second prompt's group straddles the two ranks.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from importlib import resources
from pathlib import Path

import torch

NUM_GENERATIONS = 4
PER_DEVICE = 6  # 12 completions over two ranks: groups 0 | 1 straddling | 2
MAX_COMPLETION = 24
METHOD_PARAMS = {"grpo": {"eps": 1e-4}, "rredcot": {}}  # grpo with TRL's eps: equal to TRL's own


def run(out_dir: Path, method: str) -> None:
    # TRL and the integration: the test module imports this file for its constants only.
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.integrations.trl import SegmentCreditGRPOTrainer

    path = str(resources.files("rredcot_cli") / "assets" / "tiny-chain")
    tokenizer = AutoTokenizer.from_pretrained(path)
    benchmark = make_benchmark("chain", min_steps=2, max_steps=2)
    data = Dataset.from_list([{"prompt": benchmark.prompt(p), "gold": p.gold_answer}
                              for p in benchmark.load("train", limit=6)])
    records: list[dict] = []
    trl_advantages: list[torch.Tensor] = []
    scored: list[tuple] = []

    def reward_drawn(completions, completion_ids, **_):
        """Rewards drawn per rank and call, recorded: every group, the straddling one included, gets
        differing rewards (the tiny model often samples one completion for all four generations)."""
        draw = random.Random(f"{os.environ.get('RANK', '0')}-{len(scored)}")
        rewards = [round(draw.random(), 3) for _ in completion_ids]
        scored.append((list(completions), [list(ids) for ids in completion_ids], rewards))
        return rewards

    class Recording(SegmentCreditGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            model = self.accelerator.unwrap_model(self.model)
            texts, completion_ids, rewards = scored[-1]
            records.append({
                "prompt_ids": [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])],
                "completion_ids": completion_ids, "completions": texts, "rewards": rewards,
                "completion_mask": output["completion_mask"].cpu(),
                "gold": [row["gold"] for row in inputs],
                "advantages": output["advantages"].cpu(),
                "trl_advantages": trl_advantages.pop(),
                "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            })
            return output

    original = GRPOTrainer._generate_and_score_completions

    def trl_seam(self, inputs):  # TRL's own output, before the integration replaces its advantages
        output = original(self, inputs)
        trl_advantages.append(output["advantages"].detach().cpu().clone())
        return output

    GRPOTrainer._generate_and_score_completions = trl_seam
    try:
        torch.manual_seed(0)
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-ddp-"), max_steps=2, seed=1, logging_steps=1,
                          per_device_train_batch_size=PER_DEVICE, num_generations=NUM_GENERATIONS,
                          max_completion_length=MAX_COMPLETION, learning_rate=1e-3, temperature=1.0, beta=0.0,
                          report_to="none", save_strategy="no", bf16=False, use_cpu=True,
                          gradient_checkpointing=False, use_bias_correction_kl=False)
        trainer = Recording(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=reward_drawn, args=args,
                            train_dataset=data, processing_class=tokenizer, credit_method=method,
                            method_params=METHOD_PARAMS[method], answer_column="gold",
                            extract_answer=benchmark.extract_answer, answer_probe=benchmark.ANSWER_PROBE)
        trainer.train()
    finally:
        GRPOTrainer._generate_and_score_completions = original
    rank = trainer.accelerator.process_index
    torch.save({"records": records, "world_size": trainer.accelerator.num_processes,
                "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
                "log_history": trainer.state.log_history if rank == 0 else None},
               out_dir / f"{method}-rank-{rank}.pt")


if __name__ == "__main__":
    for name in sys.argv[2:]:
        run(Path(sys.argv[1]), name)
