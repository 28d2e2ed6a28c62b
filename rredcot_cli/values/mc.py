"""Monte Carlo state values: V(S_k) = mean verified reward of K continuations sampled from the
policy after prefix S_k (VinePPO, Kazemnejad et al., arXiv 2410.01679; Math-Shepherd's "soft
estimate", Wang et al., arXiv 2312.08935).

This is the expensive, unbiased reference that the cheaper estimators (answer_probe, suffix_is)
and the attribution methods are judged against: with K continuations an estimate has standard
error sqrt(V(1-V)/K) <= 0.5/sqrt(K).

The continuations come from the policy's backend (``Backend.continuations``: the HF sampler in
rredcot_cli/policy/continuations.py, or vLLM with ``n=K`` per prefix), so MC values and the judge's
reference run on whichever engine samples. Identical prefixes (every completion's empty prefix
S_0, equal completion starts within a group) are sampled once.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# continue_prefixes(prefixes, max_new_tokens=[budget per prefix]) -> per prefix, k token lists
# (a continuation that sampled an EOS ends with it): a backend's ``continuations`` with k, the
# sampling settings and the seed bound (methods/mc.py).
ContinuePrefixes = Callable[..., list[list[list[int]]]]


def mc_rewards(
    continue_prefixes: ContinuePrefixes,
    prompts: list[list[int]],
    completions: list[list[int]],
    offsets: list[list[int]],
    verify: Callable[[int, list[int], str], Optional[float]],
    *,
    k: int,
    max_new_tokens: int,
    eos_ids: list[int],
) -> list[torch.Tensor]:
    """Rewards of k continuations after every listed completion offset of every trace.

    offsets[i]: completion-token offsets of trace i (0 = right after the prompt).
    ``verify(i, completion_ids, finish_reason)`` scores completion_ids = completion prefix +
    continuation against trace i's problem (None = unscorable, counted as 0, as sampling does);
    ``finish_reason`` is "stop" for a continuation that ended with an EOS and "length" for one cut
    off at its budget, so a truncated continuation is graded by the rule a truncated sample is. Prefixes with
    the same (prompt, completion prefix) are sampled once and verified with the first trace that
    has them. Returns per trace a float32 tensor (len(offsets[i]), k).

    ``continue_prefixes`` samples the k continuations of each distinct prefix (a backend's
    ``continuations``, e.g. ``functools.partial(policy.backend.continuations, k=k, ...)``), with
    ``eos_ids`` the tokens that end a continuation as finished.

    ``max_new_tokens`` is the completion budget the traces were sampled with: a continuation after
    offset o gets what is left of it, ``max_new_tokens - o`` tokens (at least 1), so V(S_k) is the
    chance of a correct answer under the truncation the sampled completion itself had. (Giving
    every continuation the whole budget again let a few rambling continuations from late
    prefixes run to ~2x the sampled length: the cost of a 668-token judge batch, and values no
    completion of the sampler could have.)
    """
    keys: dict[tuple[int, ...], int] = {}
    unique: list[list[int]] = []
    owner: list[tuple[int, int]] = []  # (trace, offset) of the first occurrence
    slots: list[list[int]] = []
    for i, offs in enumerate(offsets):
        row = []
        for o in offs:
            if not 0 <= o <= len(completions[i]):
                raise ValueError(f"offset {o} outside completion of length {len(completions[i])}")
            prefix = list(prompts[i]) + list(completions[i][:o])
            key = tuple(prefix)
            if key not in keys:
                keys[key] = len(unique)
                unique.append(prefix)
                owner.append((i, o))
            row.append(keys[key])
        slots.append(row)
    budgets = [max(1, max_new_tokens - o) for _, o in owner]
    conts = continue_prefixes(unique, max_new_tokens=budgets)
    rewards = torch.zeros(len(unique), k)
    for u, (i, o) in enumerate(owner):
        for j, cont in enumerate(conts[u]):
            finish_reason = "stop" if cont and cont[-1] in eos_ids else "length"
            r = verify(i, list(completions[i][:o]) + cont, finish_reason)
            rewards[u, j] = 0.0 if r is None else float(r)
    return [rewards[row] if row else torch.zeros(0, k) for row in slots]


def mc_values(*args, **kwargs) -> list[torch.Tensor]:
    """:func:`mc_rewards` averaged over the k continuations: per trace (len(offsets[i]),)."""
    return [r.mean(dim=1) for r in mc_rewards(*args, **kwargs)]
