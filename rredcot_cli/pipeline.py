"""The steps every stage shares: sample and verify, segment, attribute, evaluate.

The CLI stages call one of these each and write its artifact; the training loop calls them in
sequence every step, in process. They take explicit arguments and return plain rows (dicts
with the artifact columns), so a saved artifact and an in-memory batch are the same thing.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from rredcot_cli import credit as credit_api
from rredcot_cli.credit import run_method as attribute, token_texts  # noqa: F401 (the stages' names for them)
from rredcot_cli.errors import ConfigError
from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.benchmarks.base import Benchmark, Problem, decided_outcome, grade_completion
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.policy.load import Policy, encode_prompt, format_prompt
from rredcot_cli.rng import derive_seed
from rredcot_cli.metrics import accuracy_by_bucket, summarize_eval
from rredcot_cli.segmenters import rule_and_options

if TYPE_CHECKING:
    from rredcot_cli.config.schema import SegmentConfig


def chunks(items: list, size: int) -> Iterable[tuple[int, list]]:
    for index, start in enumerate(range(0, len(items), max(1, size))):
        yield index, items[start : start + size]


def prompts_per_call(batch_size: int, n: int) -> int:
    """How many prompts one generate() call takes so that prompts x n fits the batch size;
    ``batch_size`` 0 (or less): all of them, in one call (``sys.maxsize``)."""
    if batch_size <= 0:
        return sys.maxsize
    return max(1, batch_size // max(1, n))


def check_fits_context(policy: Policy, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
    """``ConfigError`` when the longest prompt of ``prompt_ids`` plus ``max_new_tokens`` is past the
    model's context (``max_position_embeddings``): positions past it are untrained (or an index
    error inside the model), and an absurd budget was otherwise accepted without a word."""
    context = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
    longest = max(map(len, prompt_ids), default=0)
    if not isinstance(context, int) or longest + max_new_tokens <= context:
        return
    fix = (f"set sampling.max_new_tokens <= {context - longest}" if context > longest else
           "the prompt alone does not fit: use a model with a longer context")
    raise ConfigError(f"sampling.max_new_tokens={max_new_tokens}: a prompt of {longest} tokens + {max_new_tokens} new "
                      f"tokens = {longest + max_new_tokens}, past the model's context of {context} tokens "
                      f"(max_position_embeddings); {fix}")


def sample_rows(
    policy: Policy,
    benchmark: Benchmark,
    problems: list[Problem],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    prompts_per_call: int,
    on_progress: Callable[[int], None] | None = None,
    map_chunks: Callable[[Callable[[int, list], list], list], list[list]] | None = None,
) -> list[dict]:
    """G=n completions per problem, verified; one row per completion in the samples schema.

    ``reward`` and ``pred_answer`` come from one ``grade_completion`` call (the graded answer is
    the recorded one), which also applies the benchmark's rule for completions cut off at
    ``max_new_tokens`` (``finish_reason == "length"``).

    Problems are generated in chunks of ``prompts_per_call`` with seeds derived from ``seed`` and
    the chunk index, so results do not depend on how often the progress bar refreshes, nor on
    which process generates a chunk: ``map_chunks(fn, chunks)`` (default: in order, here) returns
    ``[fn(i, chunk) ...]``; ``DataParallel.map_chunks`` spreads the chunks over ranks."""
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)

    def sample_chunk(chunk_index: int, chunk: list[Problem]) -> list[dict]:
        prompts = [format_prompt(policy.tokenizer, benchmark.prompt(p), policy.chat_template) for p in chunk]
        prompt_ids = [encode_prompt(policy.tokenizer, text, policy.chat_template) for text in prompts]
        check_fits_context(policy, prompt_ids, max_new_tokens)
        groups = policy.backend.generate(prompt_ids, params, seed=derive_seed(seed, "generate", chunk_index))
        rows: list[dict] = []
        for problem, prompt, ids, completions in zip(chunk, prompts, prompt_ids, groups):
            for sample_idx, completion in enumerate(completions):
                # One extraction: the answer recorded is the answer graded (truncation-aware).
                pred_answer, reward = grade_completion(benchmark, completion.text, problem, completion.finish_reason)
                rows.append(
                    {
                        "prompt_id": problem.prompt_id,
                        "sample_idx": sample_idx,
                        "prompt": prompt,
                        "prompt_token_ids": ids,
                        "completion": completion.text,
                        "completion_token_ids": list(completion.token_ids),
                        "completion_logprobs": [float(x) for x in completion.logprobs],
                        "reward": 0.0 if reward is None else float(reward),
                        "scorable": reward is not None,
                        "gold_answer": problem.gold_answer,
                        "pred_answer": pred_answer,
                        "benchmark": benchmark.name,
                        "finish_reason": completion.finish_reason,
                        "num_tokens": len(completion.token_ids),
                        "meta": json.dumps(problem.meta, sort_keys=True),
                    }
                )
        if on_progress is not None:
            on_progress(len(chunk))
        return rows

    chunked = [chunk for _, chunk in chunks(problems, prompts_per_call)]
    per_chunk = map_chunks(sample_chunk, chunked) if map_chunks else [sample_chunk(i, c) for i, c in enumerate(chunked)]
    return [row for rows in per_chunk for row in rows]


def completion_entropies(policy: Policy, samples: list[dict], chunk_size: int = 32) -> list[list[float]]:
    """Next-token entropy at every completion token, from one teacher-forced pass of the HF copy
    of the policy (vLLM only returns top-k log-probs, which would underestimate entropy);
    ``credit.completion_entropies`` on the samples' token ids."""
    return credit_api.completion_entropies(policy.model, policy.tokenizer.pad_token_id,
                                           [s["prompt_token_ids"] for s in samples],
                                           [s["completion_token_ids"] for s in samples], chunk_size)


def segment_rows(samples: list[dict], tokenizer: Any, settings: SegmentConfig,
                 entropies: list[list[float]] | None = None) -> list[dict]:
    """One row per segment in the segments schema; segments tile each completion exactly.

    ``settings`` (the ``segment.*`` settings) names the rule and its options; ``entropies[i]``
    (next-token entropies along completion i) feeds entropy-based rules."""
    segmenter, options = rule_and_options(settings)
    rows: list[dict] = []
    for i, sample in enumerate(samples):
        texts, spans = credit_api.segment_completion(tokenizer, sample["completion_token_ids"], segmenter,
                                                     None if entropies is None else entropies[i], **options)
        for segment_idx, (start, end) in enumerate(spans):
            rows.append(
                {
                    "prompt_id": sample["prompt_id"],
                    "sample_idx": sample["sample_idx"],
                    "segment_idx": segment_idx,
                    "token_start": start,
                    "token_end": end,
                    "text": "".join(texts[start:end]),
                    "strategy": settings.name,
                }
            )
    return rows


def credit_batch(samples: list[dict], segments: list[dict], answer_probe: str | None = None,
                 benchmark: Any = None) -> CreditBatch:
    """Pack samples and their segments into padded tensors; rows of ``samples`` keep their order.

    ``old_logprobs`` holds the sampling log-probs recorded at generation (the proposal density
    that importance-sampling estimators need); ``answer_probe`` is the benchmark's forced-answer
    template for probing values; ``benchmark`` the configured benchmark object, whose ``verify``
    methods that score new text (mc) use for rows of its name, with its settings (e.g. a
    ``jsonl`` benchmark's extractor), rather than one rebuilt from the name.

    Raises ValueError if a completion has no segments (the artifacts do not belong together)."""
    by_key: dict[tuple[str, int], list[dict]] = {}
    for seg in segments:
        by_key.setdefault((seg["prompt_id"], int(seg["sample_idx"])), []).append(seg)
    spans = []
    for sample in samples:
        key = (sample["prompt_id"], int(sample["sample_idx"]))
        segs = sorted(by_key.get(key, []), key=lambda s: s["segment_idx"])
        if not segs:
            raise ValueError(f"completion {key} has no segments")
        spans.append([(int(seg["token_start"]), int(seg["token_end"])) for seg in segs])
    group_index: dict[str, int] = {}
    group_ids = torch.tensor([group_index.setdefault(s["prompt_id"], len(group_index)) for s in samples], dtype=torch.long)
    decided = decided_values(samples, by_key, benchmark)
    return credit_api.pack_credit_batch(
        torch.tensor([float(s["reward"]) for s in samples], dtype=torch.float32), group_ids, spans,
        [s["prompt_token_ids"] for s in samples], [s["completion_token_ids"] for s in samples],
        [s["completion_logprobs"] for s in samples],
        extras={
            "gold_answers": [s["gold_answer"] for s in samples],
            "pred_answers": [s["pred_answer"] for s in samples],
            "prompt_ids": [s["prompt_id"] for s in samples],
            "answer_probe": answer_probe,
            # Benchmark name per row, so methods that verify new text (mc) can rebuild the verifier.
            "benchmarks": [s.get("benchmark") for s in samples],
            "benchmark": benchmark,
            # (B, S): the verifier's verdict on each prefix S_1..S_K where grading already fixes
            # it, NaN where not; None where the benchmark declares no decided outcomes.
            "decided_values": decided,
        },
    )


def decided_values(samples: list[dict], segments_by_key: dict[tuple[str, int], list[dict]],
                   benchmark: Any) -> torch.Tensor | None:
    """(B, S) float32: column k-1 holds ``decided_outcome`` of completion i's text through segment k
    (the segments' texts joined), graded against its gold answer, NaN where undecided or past K_i.
    None when ``benchmark`` declares no decided outcomes, so no method pays for the scan. Rows of
    another benchmark (a mixed batch) stay NaN: their verifier is not the configured one."""
    if getattr(benchmark, "decided_outcome", None) is None:
        return None
    rows = []
    for sample in samples:
        segs = sorted(segments_by_key[(sample["prompt_id"], int(sample["sample_idx"]))], key=lambda s: s["segment_idx"])
        own = sample.get("benchmark") in (None, benchmark.name)
        prefix, row = "", []
        for seg in segs:
            prefix += seg["text"]
            outcome = decided_outcome(benchmark, prefix, sample["gold_answer"]) if own else None
            row.append(float("nan") if outcome is None else float(outcome))
        rows.append(row)
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), float("nan"))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def segment_mean_advantages(token_advantages: torch.Tensor, batch: CreditBatch) -> torch.Tensor:
    """(B, T) token advantages -> (B, S) their mean over each segment's tokens, NaN past K_i: the
    push each segment actually gets from the update, whatever the method's rule."""
    mask = batch.token_mask
    B, S = mask.shape[0], batch.max_segments
    index = batch.segment_ids.clamp(min=0)
    tokens = torch.where(mask, token_advantages.to(torch.float32), torch.zeros(()))
    sums = torch.zeros(B, S).scatter_add_(1, index, tokens)
    counts = torch.zeros(B, S).scatter_add_(1, index, mask.to(torch.float32))
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full((B, S), float("nan")))


def selected_credit(credit: Credit, batch: CreditBatch, selection: Callable, entropies: torch.Tensor) -> Credit:
    """The credit an update trains on when the method also picks the tokens that carry the policy
    gradient (``MethodSpec.token_selection``, e.g. high_entropy): token advantages times the
    selection's 0/1 weights from ``entropies`` (B, T), and segment credits = the mean token
    advantage over each segment's tokens (NaN past K_i). For the judge, which sees no update: the
    entropies come from one pass over the whole judged batch (the update takes them from each of
    its forwards), so the selection's quantile is the batch's."""
    mask = batch.token_mask
    weights = selection(entropies[:, : mask.shape[1]], mask).to(torch.float32)
    tokens = torch.where(mask, credit.token_advantages * weights, torch.zeros(()))
    credits = segment_mean_advantages(tokens, batch)
    return Credit(token_advantages=tokens.contiguous(), segment_values=credit.segment_values, segment_credits=credits,
                  token_values=credit.token_values, value_targets=credit.value_targets,
                  segment_value_covered=credit.segment_value_covered)


def credit_rows(samples: list[dict], batch: CreditBatch, credit: Credit, method: str) -> tuple[list[dict], list[dict]]:
    """Per-segment credit rows and per-completion advantage rows in the artifact schemas."""
    credits: list[dict] = []
    advantages: list[dict] = []
    values = credit.segment_values.tolist()
    seg_credits = credit.segment_credits.tolist()
    covered = credit.segment_value_covered.tolist() if credit.segment_value_covered is not None else None
    for i, sample in enumerate(samples):
        key = {"prompt_id": sample["prompt_id"], "sample_idx": int(sample["sample_idx"])}
        for k in range(int(batch.num_segments[i])):
            value = values[i][k]
            credits.append({**key, "segment_idx": k, "method": method,
                            "value": None if math.isnan(value) else value, "credit": seg_credits[i][k],
                            "value_covered": None if covered is None else bool(covered[i][k])})
        n = len(sample["completion_token_ids"])
        advantages.append({**key, "method": method, "token_advantages": credit.token_advantages[i, :n].tolist()})
    return credits, advantages


def eval_rows(samples: list[dict], model_name: str) -> list[dict]:
    """Eval-schema rows from verified samples (eval = sampling on held-out problems)."""
    rows = []
    for s in samples:
        steps = json.loads(s["meta"]).get("steps")
        rows.append(
            {
                "prompt_id": s["prompt_id"],
                "sample_idx": s["sample_idx"],
                "completion": s["completion"],
                "num_tokens": s["num_tokens"],
                "pred_answer": s["pred_answer"],
                "gold_answer": s["gold_answer"],
                "correct": bool(s["scorable"] and s["reward"] > 0.5),
                "scorable": s["scorable"],
                "steps": steps,
                "benchmark": s["benchmark"],
                "model": model_name,
                "finish_reason": s["finish_reason"],
            }
        )
    return rows


def evaluate(
    policy: Policy,
    benchmark: Benchmark,
    problems: list[Problem],
    *,
    n: int,
    ks: list[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    prompts_per_call: int,
    model_name: str,
    on_progress: Callable[[int], None] | None = None,
    map_chunks: Callable | None = None,
) -> tuple[list[dict], dict]:
    """Sample n completions per held-out problem; eval rows plus a summary (pass@1 as the mean
    over samples, unbiased pass@k, maj@k, and accuracy by chain length where known)."""
    samples = sample_rows(policy, benchmark, problems, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, seed=seed, prompts_per_call=prompts_per_call, on_progress=on_progress,
                          map_chunks=map_chunks)
    rows = eval_rows(samples, model_name)
    summary = summarize_eval(rows, [k for k in ks if k <= n])
    if any(r["steps"] is not None for r in rows):
        summary["accuracy_by_steps"] = accuracy_by_bucket(rows, key="steps")
    return rows, summary
