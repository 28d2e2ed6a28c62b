"""Segment-level credit inside TRL's ``GRPOTrainer`` (TRL 1.16; ``pip install 'rredcot[trl]'``).

``SegmentCreditGRPOTrainer`` is ``trl.GRPOTrainer`` with one change: after TRL has generated and
scored a batch (``_generate_and_score_completions``), its per-sequence advantages (B,) are
replaced by per-token ones (B, T) from any rredcot credit method, computed by the public API
``rredcot_cli.credit.compute_credit`` on the same completions and rewards. TRL 1.16's
``_compute_loss`` takes (B, T) advantages as they are (it unsqueezes only a 1-D tensor), so every
``loss_type`` (grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo, vespo) runs its own clipped loss on
them, and TRL's shuffling and splitting index rows only. Nothing else of TRL is overridden.

Rewards are TRL's weighted sum of its reward functions (an unscorable completion, every function
None, gets reward 0 here, as rredcot's samples do); the completions of one prompt form a group
(``num_generations`` consecutive rows). Under several processes every process computes the credit
of the whole generation batch (groups may straddle processes) and keeps its own rows.

Sampling log-probs (rredcot's suffix_is estimator reads them): vLLM's when TRL has them, else
TRL's ``old_per_token_logps``, else one no-grad pass of the model at the sampling temperature, run
only for methods with ``needs=("policy",)`` (``docs/trl.md``).

Metrics added to TRL's logs, per generation batch: ``credit/zero_credit_share``,
``credit/value_coverage`` (methods that report values), ``credit/advantage_std``, ``_min``,
``_max``, and ``credit/forward_tokens`` where the method counts its value passes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from rredcot_cli.credit import CreditResult, compute_credit, credit_statistics, method_parameters, policy_from_model
from rredcot_cli.methods import get_method
from rredcot_cli.segmenters import needs_entropy

__all__ = ["SegmentCreditGRPOTrainer"]


@contextlib.contextmanager
def scoring_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode for the credit's scoring passes, its mode restored after (None: no
    model). Under gradient checkpointing (TRL's default) a model in train mode returns no KV cache,
    which the value estimators read; and the scoring passes should see no dropout."""
    if model is None:
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class SegmentCreditGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss uses per-token advantages from rredcot method ``credit_method``.

    Args beyond ``GRPOTrainer``'s (all keyword):
        credit_method: a registered rredcot method (``rredcot_cli.methods.method_names()``).
        method_params: its hyper-parameters (the rest keep their defaults).
        segmenter: a segmentation rule (fixed, newline, keyword, entropy, hybrid);
            ``segmenter_options`` its options (min_tokens, max_segments, ...).
        answer_column: the dataset column holding each prompt's reference answer (methods that
            read gold answers: rredcot with value=answer_probe, cscr answer_hint, delta_belief, ...);
            None: no gold answers.
        extract_answer: ``fn(completion_text) -> answer or None``, the answer a completion gave
            (cscr's answer_hint, rredcot's answer_probe candidates); None: no extracted answers.
        answer_probe: forced-answer template for answer-probe estimators (``"... {answer}"``).
        credit_batch_size: rows per scoring forward of model-based methods.
    """

    def __init__(self, *args: Any, credit_method: str = "rredcot", method_params: Mapping[str, Any] | None = None,
                 segmenter: str = "newline", segmenter_options: Mapping[str, Any] | None = None,
                 answer_column: str | None = None, extract_answer: Callable[[str], Any] | None = None,
                 answer_probe: str | None = None, credit_batch_size: int = 16, **kwargs: Any):
        # An unknown method or parameter, or a value out of range, fails before TRL loads anything.
        self.credit_spec = get_method(credit_method)
        self.credit_method = credit_method
        self.method_params = dict(method_params or {})
        method_parameters(credit_method, self.method_params)
        self.segmenter = segmenter
        self.segmenter_options = dict(segmenter_options or {})
        self.answer_column = answer_column
        self.extract_answer = extract_answer
        self.answer_probe = answer_probe
        self.credit_batch_size = credit_batch_size
        self.last_credit: CreditResult | None = None  # the latest generation batch's credit (whole batch)
        self._scored: tuple | None = None
        super().__init__(*args, **kwargs)

    # ---------------------------------------------------------------- TRL's seams

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards (gathered over processes), kept with this process's rows for the credit."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored = (inputs, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rows, completions, completion_ids, rewards_per_func = self._scored
        self._scored = None
        result = self._credit(output, rows, completions, completion_ids, rewards_per_func)
        mine = self._process_rows(len(completion_ids))
        tokens = result.token_advantages[mine]
        width = output["completion_ids"].shape[1]
        advantages = torch.zeros(tokens.shape[0], width)
        advantages[:, : min(width, tokens.shape[1])] = tokens[:, :width]
        output["advantages"] = advantages.to(output["completion_mask"].device)
        self.last_credit = result
        self._log_credit(result)
        return output

    # ---------------------------------------------------------------- the credit

    def _process_rows(self, local: int) -> slice:
        start = self.accelerator.process_index * local
        return slice(start, start + local)

    def _credit(self, output: dict, rows: list[dict], completions: list, completion_ids: list,
                rewards_per_func: torch.Tensor) -> CreditResult:
        """The whole generation batch's credit (every process's rows, gathered)."""
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)[None, :]).nansum(dim=1)
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]
        completion_ids = [list(ids) for ids in completion_ids]
        needs_policy = "policy" in self.credit_spec.needs
        logprobs = self._sampling_logprobs(output, completion_ids, needs_policy)
        # A conversational completion is a list of messages: its text is their contents.
        texts = [c if isinstance(c, str) else "".join(str(m.get("content", "")) for m in c)
                 for c in completions] if self.extract_answer is not None else None
        local = {
            "prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "logprobs": None if logprobs is None else [row[: len(c)].tolist() for row, c in zip(logprobs, completion_ids)],
            "gold": [row.get(self.answer_column) for row in rows] if self.answer_column else None,
            "pred": [self.extract_answer(t) for t in texts] if texts is not None else None,
        }
        every = {key: (None if value is None else gather_object(value)) for key, value in local.items()}
        per_prompt = self.num_generations if self.model.training else self.num_generations_eval  # as TRL groups
        group_ids = torch.arange(rewards.shape[0]) // per_prompt
        model = self.accelerator.unwrap_model(self.model) if needs_policy or self._segmenter_needs_model() else None
        policy = policy_from_model(model, self.processing_class, batch_size=self.credit_batch_size) if model else None
        with scoring_mode(model), torch.no_grad():
            return compute_credit(
                every["prompt_ids"], every["completion_ids"], rewards.detach().float().cpu(), group_ids,
                tokenizer=self.processing_class, method=self.credit_method, method_params=self.method_params,
                segmenter=self.segmenter, segmenter_options=self.segmenter_options,
                sampling_logprobs=every["logprobs"], policy=policy, gold_answers=every["gold"],
                pred_answers=every["pred"], answer_probe=self.answer_probe)

    def _segmenter_needs_model(self) -> bool:
        return needs_entropy(self.segmenter)

    def _sampling_logprobs(self, output: dict, completion_ids: list, needs_policy: bool) -> torch.Tensor | None:
        """(B, T) log-probs of the sampled tokens: vLLM's, TRL's old ones, or (for model-based
        methods only) one no-grad pass of the model at the sampling temperature."""
        for key in ("sampling_per_token_logps", "old_per_token_logps"):
            if output.get(key) is not None:
                return output[key].detach().float().cpu()
        if not needs_policy:
            return None
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, output["completion_ids"].shape[1])
        return logps.float().cpu()

    def _log_credit(self, result: CreditResult) -> None:
        mode = "train" if self.model.training else "eval"
        stats = credit_statistics(result)
        forward_tokens = result.value_stats.get("forward_tokens")
        if forward_tokens is not None:
            stats["forward_tokens"] = float(forward_tokens)
        for name, value in stats.items():
            self._metrics[mode][f"credit/{name}"].append(value)
