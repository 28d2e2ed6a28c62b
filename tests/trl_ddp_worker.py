"""One rank of ``SegmentCreditGRPOTrainer`` (or the only process), for the oracle tests
tests/methods/test_oracle_trl_ddp.py and test_oracle_trl_vllm.py.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/trl_ddp_worker.py OUT_DIR RUN...
    python tests/trl_ddp_worker.py OUT_DIR --colocate RUN...

For each RUN (a key of ``RUNS``: a credit method and its parameters) a 2-step run on the CPU on
the shipped tiny-chain model: plain ``generate``, or with ``--colocate`` TRL's colocated vLLM
(``use_vllm=True, vllm_mode="colocate"``, the CPU build of vLLM; see ``cpu_weight_sync``). Under
torchrun accelerate picks gloo (``use_cpu=True``). Every rank writes ``OUT_DIR/RUN-rank-R.pt``:
per generation batch, what this rank had on its own (its prompt and completion token ids and
texts, the rewards its reward function returned, its gold answers, vLLM's sampling log-probs when
vLLM sampled), the (B, T) advantages TRL's loss then got from the integration, TRL's own (B,)
advantages of the same batch, the sampling log-probs the integration handed to ``compute_credit``
and the model's weights at that moment; rank 0 adds TRL's log history. The tests rebuild the whole
batch from the ranks' own rows, so nothing the integration gathered is taken on trust.

Under two ranks each has 6 completions of 4 generations each, so the second prompt's group straddles them.
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
# Completions per process, by world size: two ranks hold groups 0 | 1 straddling | 2; one process two groups.
PER_DEVICE = {1: 8, 2: 6}
MAX_COMPLETION = 24
# At temperature 1 the tiny model often samples one completion for all four generations; at 2 the
# generations of a prompt differ, so suffix_is weighs other states' suffixes by their log-probs.
TEMPERATURE = 2.0
RUNS = {
    "grpo": ("grpo", {"eps": 1e-4}),  # TRL's eps: equal to TRL's own
    "rredcot": ("rredcot", {}),  # value=answer_probe: gold answers, model passes
    "rredcot-suffix_is": ("rredcot", {"value": "suffix_is"}),  # reads the sampling log-probs
}


def cpu_weight_sync(self) -> None:
    """TRL's colocate weight sync, through vLLM's ``reload_weights``. TRL 1.16's own
    (``VLLMGeneration.sync_weights``) calls the engine model's ``load_weights`` directly; the CPU
    build of vLLM 0.32 packs every Linear weight for its GEMM kernels after loading and leaves an
    empty ``Parameter`` without ``weight_loader`` in its place (``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=True)``), so TRL's sync fails on the CPU with ``AttributeError: 'Parameter' object
    has no attribute 'weight_loader'`` before the first generation. ``reload_weights`` re-runs the
    post-load packing (as rredcot's own vLLM backend syncs). Only this one TRL method is replaced."""
    weights = list(self._iter_named_params())
    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    self.llm.reset_prefix_cache()


def run(out_dir: Path, name: str, colocate: bool = False) -> None:
    # TRL and the integration: the test module imports this file for its constants only.
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.integrations import trl as integration

    method, params = RUNS[name]

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
        differing rewards whatever was sampled."""
        draw = random.Random(f"{os.environ.get('RANK', '0')}-{len(scored)}")
        rewards = [round(draw.random(), 3) for _ in completion_ids]
        scored.append((list(completions), [list(ids) for ids in completion_ids], rewards))
        return rewards

    handed: list = []

    def compute_credit(*args, **kwargs):  # what the integration hands the public API
        handed.append(kwargs["sampling_logprobs"])
        return original_credit(*args, **kwargs)

    class Recording(integration.SegmentCreditGRPOTrainer):
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
                "vllm_logprobs": None if output.get("sampling_per_token_logps") is None else
                [row[: len(ids)].tolist() for row, ids in zip(output["sampling_per_token_logps"].cpu(), completion_ids)],
                "handed_logprobs": handed.pop(),
                "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            })
            return output

    original = GRPOTrainer._generate_and_score_completions

    def trl_seam(self, inputs):  # TRL's own output, before the integration replaces its advantages
        output = original(self, inputs)
        trl_advantages.append(output["advantages"].detach().cpu().clone())
        return output

    original_credit = integration.compute_credit
    GRPOTrainer._generate_and_score_completions = trl_seam
    integration.compute_credit = compute_credit
    vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.05, vllm_max_model_length=256)
    if colocate:
        from trl.generation.vllm_generation import VLLMGeneration  # only with vLLM installed

        VLLMGeneration.sync_weights = cpu_weight_sync
    try:
        torch.manual_seed(0)
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-ddp-"), max_steps=2, seed=1, logging_steps=1,
                          per_device_train_batch_size=PER_DEVICE[int(os.environ.get("WORLD_SIZE", "1"))], num_generations=NUM_GENERATIONS,
                          max_completion_length=MAX_COMPLETION, learning_rate=1e-3, temperature=TEMPERATURE, beta=0.0,
                          report_to="none", save_strategy="no", bf16=False, use_cpu=True,
                          gradient_checkpointing=False, use_bias_correction_kl=False, **(vllm if colocate else {}))
        trainer = Recording(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=reward_drawn, args=args,
                            train_dataset=data, processing_class=tokenizer, credit_method=method,
                            method_params=params, answer_column="gold",
                            extract_answer=benchmark.extract_answer, answer_probe=benchmark.ANSWER_PROBE)
        trainer.train()
    finally:
        GRPOTrainer._generate_and_score_completions = original
        integration.compute_credit = original_credit
    rank = trainer.accelerator.process_index
    torch.save({"records": records, "world_size": trainer.accelerator.num_processes,
                "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
                "log_history": trainer.state.log_history if rank == 0 else None},
               out_dir / f"{name}-rank-{rank}.pt")


if __name__ == "__main__":
    names = [a for a in sys.argv[2:] if a != "--colocate"]
    for run_name in names:
        run(Path(sys.argv[1]), run_name, colocate="--colocate" in sys.argv[2:])
