"""The generation/scoring contract that the HF backend (``generate``) and the vLLM backend both keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, EOS included when the model stopped by itself
    logprobs: list[float]  # log-prob of each generated token under the sampling distribution
    text: str  # decoded token_ids without special tokens
    finish_reason: str  # "stop" (EOS) or "length" (hit max_new_tokens)


@dataclass
class SamplingParams:
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


class Backend(Protocol):
    tokenizer: object

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, outer list aligned with ``prompt_ids``.

        Prompts arrive as token ids (``policy.load.encode_prompt``), so the tokens a backend samples
        from are exactly the ones the trainer scores: no backend tokenizes text on its own."""

    def score(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        with_entropy: bool = False,
    ) -> tuple[list["torch.Tensor"], list["torch.Tensor"] | None]:
        """Teacher-forced log-probs (temperature 1) of each completion token given its prompt:
        a list of float32 tensors of shape (len(completion_ids[i]),); entropies of the full
        next-token distribution at the same positions when ``with_entropy``."""

    def continuations(self, prefixes: list[list[int]], *, k: int, max_new_tokens: "int | list[int]",
                      temperature: float, top_p: float, seed: int, rows_per_forward: int = 64,
                      stats: dict | None = None) -> list[list[list[int]]]:
        """``k`` continuations (token ids) of every prefix (prompt + completion prefix ids), for
        Monte Carlo values and the judge's reference: a continuation that sampled an EOS ends with
        it, one that did not has its prefix's budget (``max_new_tokens``: one for all, or one per
        prefix). Randomness is seeded per prefix from ``seed`` and the prefix's tokens, so a
        prefix's continuations do not depend on which other prefixes share the call. ``stats``
        (optional) gains ``prefill_tokens``, ``generated_tokens`` and ``continuations``."""

    def sleep(self) -> None:
        """Free what generation holds until the next ``sync_weights``; no-op where nothing is held.

        The trainer calls it just before a policy update (so a vLLM engine on the same GPU gives
        its weights and KV cache back) and ``sync_weights`` right after; generating or scoring
        in between is an error where the backend really slept."""

    def sync_weights(self, model: object) -> None:
        """Make generation use the weights of ``model`` (the policy being trained), waking the
        backend first if ``sleep`` put it to sleep."""
