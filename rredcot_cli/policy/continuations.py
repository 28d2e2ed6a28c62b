"""The HF backend's continuation sampler: ``k`` continuations of many prefixes with each prefix's
KV cache shared, for Monte Carlo values (values/mc.py) and the judge's reference.

Sampling reuses each prefix: the left-padded prefixes of a chunk are encoded once, their KV
cache is repeated K times (``batch_repeat_interleave``) and the K continuations decode from it,
so a prefix costs one prefill instead of K (HF ``generate(num_return_sequences=K)`` would expand
the inputs before the prefill).

Randomness is per prefix: the Gumbel noise of a prefix's K rows comes from a generator seeded by
``prefix_seed(seed, prefix tokens)``, so a continuation depends on (model, prefix, seed, K,
sampling settings) only, not on which other prefixes share its batch. The vLLM backend seeds its
requests with the same ``prefix_seed`` (rredcot_cli/policy/vllm.py ``continuations``).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch
from transformers import DynamicCache

from rredcot_cli.policy.kvcache import cache_kwarg, growing_cache
from rredcot_cli.rng import derive_seed


def _returned_cache(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def _empty_cache(model: torch.nn.Module, max_length: int):
    """kvcache.growing_cache (no copy of the whole cache per decoded token: at ~700-token prefixes
    transformers' concatenating cache made continuations ~6x slower than the sampler), or
    transformers' own where the installed version has no layered cache."""
    return growing_cache(model, max_length) or DynamicCache()


def warp_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(R, V) logits -> (R, V) log-probs of the sampling distribution (temperature, then top-p:
    keep the smallest set of most likely tokens whose mass reaches ``top_p``, as HF's warper).
    Tokens outside the nucleus get -inf."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_logp.exp()
        # Drop a token when the mass of the tokens strictly before it already reaches top_p.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


def prefix_seed(seed: int, prefix: list[int]) -> int:
    """The seed of one prefix's continuations: a function of the tokens, not of the batch."""
    digest = hashlib.sha256(",".join(map(str, prefix)).encode()).hexdigest()
    return derive_seed(seed, "mc", digest)


@torch.no_grad()
def sample_continuations(
    model: torch.nn.Module,
    prefixes: list[list[int]],
    *,
    k: int,
    max_new_tokens: int | Sequence[int],
    temperature: float,
    top_p: float,
    eos_ids: list[int],
    pad_id: int,
    seed: int,
    device: str = "cpu",
    rows_per_forward: int = 64,
    stats: dict | None = None,
) -> list[list[list[int]]]:
    """``k`` continuations of every prefix, sampled with the KV cache of the prefix shared.

    prefixes[j]: token ids (prompt + completion prefix), at least one token. Returns, per prefix,
    k token lists; a continuation that sampled an EOS ends with it, one that did not has
    ``max_new_tokens`` tokens (one budget for every prefix, or one per prefix, each >= 1).
    temperature 0 = greedy (all k rows identical).
    ``stats``: ``prefill_tokens`` (prefix positions encoded, padding included),
    ``generated_tokens`` (decode steps x rows still running), ``continuations``.
    """
    results: list[list[list[int]] | None] = [None] * len(prefixes)
    budgets = [max_new_tokens] * len(prefixes) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prefixes) or min(budgets, default=1) < 1:
        raise ValueError("max_new_tokens: one budget >= 1, or one per prefix")
    eos = torch.tensor(sorted(set(eos_ids)), device=device)
    # Similar lengths share a chunk (less padding).
    order = sorted(range(len(prefixes)), key=lambda j: len(prefixes[j]))
    per_chunk = max(1, rows_per_forward // max(1, k))
    for start in range(0, len(order), per_chunk):
        chunk = order[start : start + per_chunk]
        width = max(len(prefixes[j]) for j in chunk)
        longest = max(budgets[j] for j in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, j in enumerate(chunk):
            if not prefixes[j]:
                raise ValueError("a prefix needs at least one token (the prompt)")
            input_ids[r, width - len(prefixes[j]) :] = torch.tensor(prefixes[j])
            attention[r, width - len(prefixes[j]) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        # Left padding: positions count real tokens only, as in HF generate.
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **cache_kwarg(model, _empty_cache(model, width + longest)))
        cache = _returned_cache(out)
        cache.batch_repeat_interleave(k)
        logits = out.logits[:, -1].repeat_interleave(k, dim=0)
        attention = attention.repeat_interleave(k, dim=0)
        next_position = positions[:, -1].repeat_interleave(k) + 1
        row_budget = torch.tensor([budgets[j] for j in chunk], device=device).repeat_interleave(k)
        generators = []
        for j in chunk:
            g = torch.Generator(device=device)
            g.manual_seed(prefix_seed(seed, prefixes[j]))
            generators.append(g)
        rows = len(chunk) * k
        # Finished rows leave the batch a quarter of it at a time (each drop copies the cache once),
        # so a chunk costs about the tokens actually generated, not rows x the longest continuation.
        in_batch = torch.arange(rows, device=device)  # original row index of each batch row
        live = torch.ones(rows, dtype=torch.bool, device=device)  # not finished, per batch row
        sampled = torch.full((rows, longest), pad_id, dtype=torch.long, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        generated = 0
        for step in range(longest):
            if temperature > 0:
                logp = warp_logits(logits, temperature, top_p)
                # Gumbel-max sampling, argmax(log p + G) ~ p, with noise from the prefix's own
                # generator: a full (k, V) draw per step while any of its rows runs, so the stream
                # does not depend on which rows have finished or on other prefixes.
                owners = in_batch // k
                noise = torch.zeros_like(logp)
                for r, g in enumerate(generators):
                    here = owners == r
                    if bool((here & live).any()):
                        noise[here] = torch.rand((k, logp.shape[-1]), generator=g, device=device)[in_batch[here] % k]
                gumbel = -torch.log(-torch.log(noise.clamp(min=torch.finfo(torch.float32).tiny)))
                token = (logp + gumbel).argmax(-1)
            else:
                token = logits.argmax(-1)
            sampled[in_batch[live], step] = token[live]
            lengths[in_batch[live]] = step + 1
            generated += int(live.sum())
            live = live & ~torch.isin(token, eos) & (row_budget[in_batch] > step + 1)
            if not bool(live.any()):
                break
            if 4 * int((~live).sum()) >= live.numel():
                keep = live.nonzero()[:, 0]
                cache.batch_select_indices(keep)
                in_batch, live, token = in_batch[keep], live[keep], token[keep]
                attention, next_position = attention[keep], next_position[keep]
            attention = torch.cat([attention, torch.ones((in_batch.numel(), 1), dtype=attention.dtype, device=device)], 1)
            out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position[:, None],
                        use_cache=True, **cache_kwarg(model, cache))
            cache = _returned_cache(out)
            logits = out.logits[:, -1]
            next_position = next_position + 1
        sampled, lengths = sampled.cpu().tolist(), lengths.cpu().tolist()
        for r, j in enumerate(chunk):
            results[j] = [sampled[row][: lengths[row]] for row in range(r * k, (r + 1) * k)]
        if stats is not None:
            stats["prefill_tokens"] = stats.get("prefill_tokens", 0) + len(chunk) * width
            stats["generated_tokens"] = stats.get("generated_tokens", 0) + generated
            stats["continuations"] = stats.get("continuations", 0) + rows
    return results  # type: ignore[return-value]
