"""TRL's own trainers as an oracle for the advantages and the loss (issue 30, item 2).

The oracle tests (``tests/methods/test_oracle_trl.py``, ``tests/train/test_oracle_trl_loss.py``,
marker ``oracle``) import this module only after ``pytest.importorskip("trl")``; without TRL they
skip. CI's vLLM lane installs ``trl==1.16.0`` and runs them (.ci/run).

TRL 1.16 computes GRPO's and RLOO's advantages inline in ``_generate_and_score_completions`` and
the clipped loss inline in ``_compute_loss``; no module-level function does either. So the
oracle is a real ``GRPOTrainer`` / ``RLOOTrainer`` built once per session on a randomly
initialised one-layer Llama (the tiny-chain tokenizer) and run through those two methods as its
training loop would:

- advantages: ``_generate_and_score_completions`` on a list of rows whose reward function reads
  the reward from a dataset column (TRL passes extra columns to reward functions), so the rewards
  are the test's fixed tensors. The completions it generates only feed that reward function.
- loss: ``_compute_loss`` on a fixed batch (completion ids, ragged right-padded mask, advantages,
  old/ref/importance-sampling tensors). Its forward pass is real; ``LogpSpy`` keeps the per-token
  log-probs it returned, so rredcot's loss is evaluated on the very same tensor and both
  gradients are taken with respect to it.

Knobs are set on the trainer the way ``GRPOTrainer.__init__`` copies them from the config
(``loss_type``, ``epsilon_low``, ``beta``, ``scale_rewards``, ``num_generations``, ...) and put
back afterwards (``trainer_attrs``), so one trainer serves every case.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from importlib import resources

import torch

PROMPT = "1+1="


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resources.files("rredcot_cli") / "assets" / "tiny-chain"))


def _tiny_model(tokenizer):
    """A randomly initialised one-layer Llama over the tokenizer's vocabulary (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def reward_from_column(completions, reward, **_):
    """TRL reward function: the reward is the row's ``reward`` column, i.e. the test's tensor."""
    return [float(r) for r in reward]


@functools.lru_cache(maxsize=None)
def grpo_trainer():
    """A real TRL ``GRPOTrainer`` (CPU, fp32, beta 0, no checkpoint) in train mode."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = _tokenizer()
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-oracle-"), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=2, report_to="none", bf16=False, use_cpu=True,
                      beta=0.0, save_strategy="no", gradient_checkpointing=False, use_bias_correction_kl=False)
    trainer = GRPOTrainer(model=_tiny_model(tokenizer), reward_funcs=reward_from_column, args=args,
                          train_dataset=Dataset.from_list([{"prompt": PROMPT, "reward": 0.0}] * 2),
                          processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # the training loop sets it per optimizer step
    return trainer


@functools.lru_cache(maxsize=None)
def rloo_trainer():
    """A real TRL ``RLOOTrainer`` (CPU, fp32, beta 0: no KL in the reward) in train mode."""
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    tokenizer = _tokenizer()
    args = RLOOConfig(output_dir=tempfile.mkdtemp(prefix="trl-oracle-"), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=2, report_to="none", bf16=False, use_cpu=True,
                      beta=0.0, save_strategy="no", gradient_checkpointing=False)
    trainer = RLOOTrainer(model=_tiny_model(tokenizer), reward_funcs=reward_from_column, args=args,
                          train_dataset=Dataset.from_list([{"prompt": PROMPT, "reward": 0.0}] * 2),
                          processing_class=tokenizer)
    trainer.model.train()
    return trainer


@contextlib.contextmanager
def trainer_attrs(obj, **values):
    """Set attributes of a trainer (or its args) for the block, then put the old values back."""
    old = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield obj
    finally:
        for name, value in old.items():
            setattr(obj, name, value)


def trl_advantages(trainer, rewards: torch.Tensor, group_size: int, **attrs) -> torch.Tensor:
    """(B,) float32 rewards, rows ``[g k, (g + 1) k)`` forming group g -> TRL's (B,) advantages,
    computed by the trainer's ``_generate_and_score_completions`` with ``num_generations = k``
    and the trainer attributes ``attrs`` (e.g. ``scale_rewards="none"``)."""
    rows = [{"prompt": PROMPT, "reward": r} for r in rewards.tolist()]
    with trainer_attrs(trainer, num_generations=group_size, **attrs):
        output = trainer._generate_and_score_completions(rows)
    return output["advantages"]


class LogpSpy:
    """Wraps the trainer's ``_get_per_token_logps_and_entropies`` (the real forward) and keeps the
    (B, T) per-token log-probs it returned, so another loss can be evaluated on the same tensor."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.logps = None

    def __enter__(self):
        original = type(self.trainer)._get_per_token_logps_and_entropies

        def spy(*args, **kwargs):
            logps, entropies, aux = original(self.trainer, *args, **kwargs)
            self.logps = logps
            return logps, entropies, aux

        self.trainer._get_per_token_logps_and_entropies = spy
        return self

    def __exit__(self, *exc):
        del self.trainer._get_per_token_logps_and_entropies  # the class's method again


def loss_batch(seed: int, rows: int = 6, length: int = 7, empty_rows: int = 1) -> dict:
    """A fixed ragged batch: completion ids (B, T), a right-padded mask with ``empty_rows`` rows of
    no tokens, (B,) advantages with both signs, and the seed's generator for the log-prob offsets."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    lengths[:empty_rows] = 0
    mask = torch.arange(length)[None, :] < lengths[:, None]
    completion_ids = torch.randint(3, 40, (rows, length), generator=gen)
    advantages = torch.randn(rows, generator=gen)
    return {"mask": mask, "completion_ids": completion_ids, "advantages": advantages, "gen": gen}


def trl_inputs(trainer, batch: dict, old_offsets: torch.Tensor, ref_offsets: torch.Tensor | None,
               importance_sampling_ratio: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
    """TRL's ``_compute_loss`` inputs for ``batch``; old (and ref) log-probs are the model's own
    log-probs minus the given (B, T) offsets, so the ratios (and KL) are the test's choice.
    Returns the inputs and the model's (B, T) log-probs they were built from (no grad)."""
    rows, length = batch["completion_ids"].shape
    tokenizer = trainer.processing_class
    prompt_ids = torch.tensor([tokenizer(PROMPT, add_special_tokens=False)["input_ids"]] * rows)
    prompt_mask = torch.ones_like(prompt_ids)
    completion_mask = batch["mask"].long()
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, batch["completion_ids"]], 1),
            torch.cat([prompt_mask, completion_mask], 1), length)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": batch["completion_ids"],
              "completion_mask": completion_mask, "advantages": batch["advantages"],
              "old_per_token_logps": logps - old_offsets,
              "num_items_in_batch": completion_mask.sum()}
    if ref_offsets is not None:
        inputs["ref_per_token_logps"] = logps - ref_offsets
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    return inputs, logps
