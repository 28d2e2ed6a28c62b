"""Segment-level credit as one library call: the public, stable credit API.

``compute_credit`` takes what any RL trainer has after it sampled and scored a batch (prompt and
completion token ids, rewards, group ids, the sampling log-probs and the policy), splits the
completions into segments with a named rule (``rredcot_cli.segmenters``) and runs a registered
credit method (``rredcot_cli.methods``) on them. No config, run folder or CLI: it needs torch and
transformers only, so a TRL, verl or slime hook can call it (``docs/trl.md``).

It is the stages' own path, not a second one: ``rredcot segment``, ``rredcot attribute`` and the
training loop go through ``segment_completion``, ``pack_credit_batch`` and ``run_method`` below
(``rredcot_cli.pipeline`` adapts the artifact rows to them), and ``compute_credit`` is those three
in sequence.

Shapes: B completions, T = the longest completion's length, S = the most segments of a completion.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from rredcot_cli.config.ranges import check_method_params
from rredcot_cli.config.schema import SegmentConfig
from rredcot_cli.methods import MethodSpec, get_method
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.load import Policy
from rredcot_cli.policy.logprobs import ForwardPass, chunked_completion_logprobs, head_chunk_rows
from rredcot_cli.segmenters import Spans, get_segmenter, needs_entropy

__all__ = ["CreditResult", "compute_credit", "credit_statistics", "policy_from_model", "method_defaults", "method_parameters",
           "segment_completion", "pack_credit_batch", "run_method", "completion_entropies", "token_texts"]


@dataclass
class CreditResult:
    """What ``compute_credit`` returns: the method's ``Credit`` and the ``CreditBatch`` it ran on."""

    credit: Credit
    batch: CreditBatch

    @property
    def token_advantages(self) -> torch.Tensor:
        """(B, T) float32 per-token advantages, exactly 0 past each completion's end."""
        return self.credit.token_advantages

    @property
    def segment_values(self) -> torch.Tensor:
        """(B, S) float32 value after each segment; NaN where the segment does not exist or the
        method estimates no values (outcome-only methods)."""
        return self.credit.segment_values

    @property
    def segment_credits(self) -> torch.Tensor:
        """(B, S) float32 credit of each segment; NaN where the segment does not exist."""
        return self.credit.segment_credits

    @property
    def segment_ids(self) -> torch.Tensor:
        """(B, T) int64 segment index of each completion token, -1 past its end."""
        return self.batch.segment_ids

    @property
    def num_segments(self) -> torch.Tensor:
        """(B,) int64 segments per completion (>= 1)."""
        return self.batch.num_segments

    @property
    def value_stats(self) -> dict:
        """The method's diagnostics (e.g. ``forward_tokens``: positions its value estimation ran)."""
        return dict((self.batch.extras or {}).get("value_stats") or {})


# ------------------------------------------------------------------------------------------
# The three steps the stages share
# ------------------------------------------------------------------------------------------


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (what segmenters look at)."""
    return tokenizer.batch_decode([[t] for t in token_ids], skip_special_tokens=False)


def segment_completion(tokenizer: Any, completion_ids: Sequence[int], rule: Callable[..., Spans],
                       entropies: Sequence[float] | None = None, **options: Any) -> tuple[list[str], Spans]:
    """One completion's token texts and its segments: half-open token spans that tile it.

    ``rule`` is a segmentation rule (``rredcot_cli.segmenters.get_segmenter(name)``: fixed,
    newline, keyword, entropy, hybrid); ``options`` are its fields (``SegmentConfig``: min_tokens,
    max_segments, ...); ``entropies`` (len(completion_ids),) the next-token entropies that
    entropy and hybrid read."""
    texts = token_texts(tokenizer, completion_ids)
    return texts, rule(texts, entropies=None if entropies is None else list(entropies), **options)


def pack_credit_batch(rewards: torch.Tensor, group_ids: torch.Tensor, spans: Sequence[Spans],
                      prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                      sampling_logprobs: Sequence[Sequence[float]] | torch.Tensor | None = None,
                      extras: dict[str, Any] | None = None) -> CreditBatch:
    """Padded tensors for a credit method.

    rewards (B,) float, group_ids (B,) int, spans[i] the segments of completion i (tiling it),
    sampling_logprobs (B, >= T) or ragged rows (0 past each end; zeros when None). Raises
    ValueError if a completion has no segments."""
    lengths = [len(c) for c in completion_ids]
    T = max(lengths, default=0)
    segment_ids = torch.full((len(lengths), T), -1, dtype=torch.long)
    num_segments = torch.ones(len(lengths), dtype=torch.long)
    for i, segs in enumerate(spans):
        if not segs:
            raise ValueError(f"completion {i} has no segments")
        for k, (start, end) in enumerate(segs):
            segment_ids[i, start:end] = k
        num_segments[i] = len(segs)
    logprobs = torch.zeros(len(lengths), T)
    if sampling_logprobs is not None:
        for i, n in enumerate(lengths):
            row = torch.as_tensor(sampling_logprobs[i][:n], dtype=torch.float32)
            logprobs[i, : len(row)] = row
    return CreditBatch(rewards=torch.as_tensor(rewards, dtype=torch.float32).clone(),
                       group_ids=torch.as_tensor(group_ids, dtype=torch.long).clone(),
                       segment_ids=segment_ids, num_segments=num_segments,
                       prompt_token_ids=[list(p) for p in prompt_ids],
                       completion_token_ids=[list(c) for c in completion_ids],
                       old_logprobs=logprobs, extras=dict(extras or {}))


def run_method(spec: MethodSpec, batch: CreditBatch, params: Mapping[str, Any],
               collaborators: Mapping[str, Any]) -> Credit:
    """Run a registered credit method with its hyper-parameters and the collaborators it needs."""
    missing = [name for name in spec.needs if name not in collaborators]
    if missing:
        raise ValueError(f"method {spec.name!r} needs {', '.join(missing)}, which this stage did not provide")
    return spec.fn(batch, **params, **{name: collaborators[name] for name in spec.needs})


# ------------------------------------------------------------------------------------------
# The call
# ------------------------------------------------------------------------------------------


def method_defaults(method: str) -> dict[str, Any]:
    """Method ``method``'s hyper-parameters with their defaults (its registered params dataclass)."""
    return dataclasses.asdict(get_method(method).params())


def method_parameters(method: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Method ``method``'s hyper-parameters: its defaults overridden by ``given``; an unknown name or a value outside its range is
    refused in one line (``ConfigError`` for ranges, like ``method.<param>=`` on the CLI)."""
    spec = get_method(method)
    params = dataclasses.asdict(spec.params())
    unknown = sorted(set(given or {}) - set(params))
    if unknown:
        raise ValueError(f"method {spec.name!r} has no parameter {', '.join(unknown)}; "
                         f"valid: {', '.join(params) or '(none)'}")
    params.update(given or {})
    check_method_params(spec.name, params, "method_params.")
    return params


def policy_from_model(model: Any, tokenizer: Any, *, batch_size: int = 64, chat_template: bool = False) -> Policy:
    """The ``policy`` collaborator of model-based methods (``needs=("policy",)``) from a
    transformers causal LM already on its device and its tokenizer (which needs a pad token)."""
    device = str(next(model.parameters()).device)
    return Policy(model=model, tokenizer=tokenizer, backend=HFBackend(model, tokenizer, batch_size=batch_size, device=device),
                  device=device, chat_template=chat_template)


def completion_entropies(model: Any, pad_id: int, prompt_ids: Sequence[Sequence[int]],
                         completion_ids: Sequence[Sequence[int]], chunk_size: int = 32) -> list[list[float]]:
    """Next-token entropy at every completion token from one teacher-forced pass of ``model``.

    The LM head, log-softmax and entropy run over the real completion positions only,
    ``logprobs.head_chunk_rows`` of them at a time: (rows, positions, vocabulary) logits of a pass
    held 7.3 GB at SmolLM2's 49k vocabulary for 32 completions of 200 tokens."""
    prompts = [list(p) for p in prompt_ids]
    completions = [list(c) for c in completion_ids]
    forward = ForwardPass(chunk_tokens=head_chunk_rows(model))
    _, _, entropies = chunked_completion_logprobs(model, prompts, completions, pad_id, chunk_size, forward)
    return [entropies[i, : len(c)].tolist() for i, c in enumerate(completions)]


def compute_credit(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    *,
    tokenizer: Any,
    method: str = "grpo",
    method_params: Mapping[str, Any] | None = None,
    segmenter: str = "newline",
    segmenter_options: Mapping[str, Any] | None = None,
    sampling_logprobs: torch.Tensor | Sequence[Sequence[float]] | None = None,
    model: Any = None,
    policy: Policy | None = None,
    gold_answers: Sequence[Any] | None = None,
    pred_answers: Sequence[Any] | None = None,
    answer_probe: str | None = None,
    entropies: Sequence[Sequence[float]] | None = None,
    collaborators: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
) -> CreditResult:
    """Segment B completions and credit them with a registered method.

    Args:
        prompt_ids: B prompts' token ids (ragged, no padding).
        completion_ids: B completions' token ids (ragged, no padding, EOS included if sampled).
        rewards: (B,) verified reward per completion.
        group_ids: (B,) int; completions of the same prompt share an id.
        tokenizer: decodes tokens for the segmenter (and scores for model-based methods).
        method: a registered method (``rredcot_cli.methods.method_names()``).
        method_params: its hyper-parameters; the rest keep their defaults (``method_defaults``).
        segmenter: a rule of ``rredcot_cli.segmenters``; ``segmenter_options`` override its
            ``SegmentConfig`` defaults (min_tokens 4, max_segments 40, ...).
        sampling_logprobs: (B, >= T) or ragged: log-probs of the sampled tokens under the sampler
            (rredcot's suffix_is value estimator needs them; zeros when None).
        model / policy: the current policy, for methods with ``needs=("policy",)`` (an extra
            forward pass per step) and for the entropy and hybrid segmenters; ``model`` is wrapped
            with ``policy_from_model(model, tokenizer)``.
        gold_answers / pred_answers: (B,) reference and extracted answers (rredcot's answer_probe,
            cscr's answer_hint, delta_belief, loo, gradient, mc read them).
        answer_probe: forced-answer template (``"... {answer}"``) for answer-probe estimators.
        entropies: B rows of next-token entropies; computed with the policy when the segmenter
            needs them and none are given.
        collaborators: other collaborators a method needs (e.g. ``{"critic": ...}`` for ppo).
        extras: more per-batch side information for ``CreditBatch.extras`` (mc reads
            ``benchmarks``, ``benchmark`` and ``prompt_ids``: see ``pipeline.credit_batch``).

    Returns:
        ``CreditResult``: token_advantages (B, T), segment_values and segment_credits (B, S),
        segment_ids (B, T), num_segments (B,), value_stats, and the ``Credit`` / ``CreditBatch``.
    """
    spec = get_method(method)
    params = method_parameters(method, method_params)
    if policy is None and model is not None:
        policy = policy_from_model(model, tokenizer)
    options = {k: v for k, v in dataclasses.asdict(SegmentConfig()).items() if k != "name"}
    options.update(segmenter_options or {})
    if entropies is None and needs_entropy(segmenter):
        if policy is None:
            raise ValueError(f"segmenter {segmenter!r} reads next-token entropies: pass entropies= or model=")
        entropies = completion_entropies(policy.model, tokenizer.pad_token_id, prompt_ids, completion_ids)
    rule = get_segmenter(segmenter)
    spans = [segment_completion(tokenizer, ids, rule, None if entropies is None else entropies[i], **options)[1]
             for i, ids in enumerate(completion_ids)]
    side: dict[str, Any] = {"answer_probe": answer_probe, **(extras or {})}
    if gold_answers is not None:
        side["gold_answers"] = list(gold_answers)
    side["pred_answers"] = list(pred_answers) if pred_answers is not None else [None] * len(completion_ids)
    batch = pack_credit_batch(torch.as_tensor(rewards), torch.as_tensor(group_ids), spans, prompt_ids, completion_ids,
                              sampling_logprobs, side)
    helpers = dict(collaborators or {})
    if policy is not None:
        helpers.setdefault("policy", policy)
        helpers.setdefault("scorer", policy.backend)
    missing = [name for name in spec.needs if name not in helpers]
    if missing:
        raise ValueError(f"method {spec.name!r} needs {', '.join(missing)}: pass model= (or policy=) for the policy "
                         f"and its scorer, collaborators={{name: ...}} for anything else")
    try:
        credit = run_method(spec, batch, params, helpers)
    except KeyError as error:  # a method reading side information the caller did not give
        if error.args and error.args[0] in _ANSWER_INPUTS:
            raise ValueError(f"method {spec.name!r} with these parameters reads {error.args[0]}: pass "
                             f"{_ANSWER_INPUTS[error.args[0]]}") from error
        raise
    return CreditResult(credit=credit, batch=batch)


# Side information methods read by name from CreditBatch.extras, and the argument that fills it.
_ANSWER_INPUTS = {"gold_answers": "gold_answers= (the TRL trainer: answer_column=)"}


def credit_statistics(result: CreditResult) -> dict[str, float]:
    """Summary numbers of one batch's credit, for a trainer's logs:

    - ``zero_credit_share``: share of the completions' segments whose credit is exactly 0;
    - ``value_coverage``: share of the segments with a finite value (only for methods that
      report values: absent when every value is NaN);
    - ``advantage_std`` / ``advantage_min`` / ``advantage_max``: spread of the token advantages
      over completion tokens (std absent with fewer than two tokens)."""
    batch, credit = result.batch, result.credit
    exists = torch.arange(credit.segment_credits.shape[1])[None, :] < batch.num_segments[:, None]
    stats: dict[str, float] = {}
    if bool(exists.any()):
        stats["zero_credit_share"] = float((credit.segment_credits[exists] == 0).double().mean())
        values = credit.segment_values[exists]
        if bool(torch.isfinite(values).any()):
            stats["value_coverage"] = float(torch.isfinite(values).double().mean())
    tokens = credit.token_advantages[batch.token_mask].double()
    if tokens.numel():
        stats["advantage_min"], stats["advantage_max"] = float(tokens.min()), float(tokens.max())
    if tokens.numel() > 1:
        stats["advantage_std"] = float(tokens.std())
    return stats
