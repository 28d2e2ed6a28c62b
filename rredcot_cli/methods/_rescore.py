"""Teacher-forced rescoring of fixed completions under other contexts, for the token-reweighting
methods (cscr, sc_grpo, cort).

Every context is scored with the same helper and the same model, base context included, rather
than reusing the sampling log-probs: those come from the generation kernels at the sampling
temperature, and a contrast between two differently computed numbers measures the difference in
computation as well as in context (docs/design/peer-methods.md section 7, arXiv 2606.15621).
"""

from __future__ import annotations

import torch

from rredcot_cli.policy.logprobs import completion_logprobs, pack_prompt_completion


def pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of a context fragment, without special tokens (as prompts are encoded)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _count(stats: dict | None, prompts: list[list[int]], completions: list[list[int]]) -> None:
    """Add the prompt + completion positions run (padding excluded) to ``stats["forward_tokens"]``."""
    if stats is not None:
        positions = sum(len(p) + len(c) for p, c in zip(prompts, completions))
        stats["forward_tokens"] = stats.get("forward_tokens", 0) + positions


@torch.no_grad()
def sampled_token_logprobs(model, tokenizer, prompts: list[list[int]], completions: list[list[int]], *,
                           batch_size: int, stats: dict | None = None) -> list[torch.Tensor]:
    """log pi(y_t | prompt, y_<t) at temperature 1 for each completion token; one (len(c),)
    float32 CPU tensor per row, ``batch_size`` rows per forward."""
    out: list[torch.Tensor] = []
    size = max(1, batch_size)
    for start in range(0, len(prompts), size):
        p, c = prompts[start : start + size], completions[start : start + size]
        lp, _, _ = completion_logprobs(model, p, c, pad_id(tokenizer), with_entropy=False)
        out.extend(lp[i, : len(ci)].float().cpu() for i, ci in enumerate(c))
    _count(stats, prompts, completions)
    return out


@torch.no_grad()
def completion_logits(model, prompts: list[list[int]], completions: list[list[int]], pad: int) -> torch.Tensor:
    """Next-token logits at every completion position: (B, T, V) in the model's dtype and on its
    device (the rows ``completion_logprobs`` picks the sampled token from); padding positions
    hold arbitrary rows, mask them. T = the longest completion, >= 1."""
    device = next(model.parameters()).device
    input_ids, attention_mask, mask, _ = pack_prompt_completion(prompts, completions, pad)
    width_t = mask.shape[1]
    if width_t == 0:
        raise ValueError("completion_logits needs at least one completion token")
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    # The logit at the last column predicts past the end of the longest completion: dropped.
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 logits_to_keep=width_t + 1, use_cache=False).logits[:, :-1, :]
