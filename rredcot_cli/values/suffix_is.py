"""``suffix_is``: importance sampling over continuations the group already sampled
(RREDCoT's IS estimator, docs/design/rredcot-method.md section 4.2).

A suffix y of trace j, cut at its boundary m, was drawn from q = pi_old(. | S_j,m). Re-scored after
the prefix S_i,k of trace i, it estimates

    V(S_i,k) ~= sum_y w(y) R_j / N            (plain)   or   sum_y w(y) R_j / sum_y w(y)   (self-normalised)
    w(y) = exp(log pi(y | S_i,k) - log q(y))  over the first ``window`` tokens of y (all if 0),
                                              or its first ``window`` segments (window_unit="segments")

Deviations, all options: the lookahead window truncates the likelihood ratio to bound cost and
variance (the utility stays the full trace's reward); counted in tokens it covers less of a step
the more verbose the format (16 tokens are two step lines of `chain` but a fifth of one of
`chain_verbose`, where it localises nothing: docs/studies/credit-quality.md), counted in segments it
covers the same steps whatever their length; weights are clipped at ``clip`` (0 = off);
``matched`` uses only suffixes cut at the same segment index k, ``all`` every boundary of every
trace in the group. Everything is computed in log space until the final normalisation.

Leave-one-out (issue 37): only the *other* members' suffixes are evidence for V(S_i,k). Before, trace
i's own next segment was one of them; on-policy its weight is exactly 1 and its utility is R_i, while
other traces' text, written from other prefixes, gets likelihood ratios near 0 on real model text,
so the self-normalised estimate collapsed to V(S_i,k) ~= R_i: the own outcome fed back into the
prefix values (86 % of SmolLM2's multi-line answers within 0.05 of their own reward). The same held
for the "every usable suffix has one utility" shortcut when the own suffix was among them. Now a
prefix whose group has no other usable suffix has no estimate (NaN: RREDCoT keeps the previous
value and counts the boundary as uncovered).

Ordinary importance sampling (``self_normalised=False``, the default since issue 37) is the
estimator whose bias the paper states (non-positive, zero only when the sampled suffixes cover
every rewarded continuation): foreign suffixes that the prefix makes implausible get weights near
0 and pull V towards 0, where self-normalisation would rescale them to sum to 1 and keep their
rewards. Its estimate is capped at the largest utility among the suffixes (a clipped weight above
1 could otherwise give V > 1, which no probability of success can be).
"""

from __future__ import annotations

import math

import torch

from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.values.packing import Probe, cached_probe_logprobs, probe_scorer, value_stats
from rredcot_cli.values.registry import ValueSettings, register_value_estimator

WINDOW_UNITS = ("tokens", "segments")


def suffix_is_values(
    model: torch.nn.Module,
    traces: list[list[int]],
    prompt_lens: list[int],
    boundaries: list[list[int]],
    sampling_logprobs: list[list[float]],
    rewards: list[float],
    groups: list[int],
    *,
    matched: bool,
    window: int,
    self_normalised: bool,
    clip: float,
    window_unit: str = "tokens",
    device: str = "cpu",
    stats: dict | None = None,
    scorer=cached_probe_logprobs,
) -> list[torch.Tensor]:
    """Value of trace i after each of its boundaries.

    boundaries[i]: completion-token offsets b_i,0 < ... (S_i,k = prompt + completion[:b_i,k]);
    sampling_logprobs[i]: log q of each completion token as sampled. Returns per trace a float32
    tensor (len(boundaries[i]),); a prefix with no usable suffix of another trace of its group gets
    NaN. ``window_unit``:
    ``tokens`` or ``segments`` (a suffix cut at boundary m then ends at boundary m + window, or
    at the completion's end).
    """
    if window_unit not in WINDOW_UNITS:
        raise ValueError(f"unknown window unit {window_unit!r}; valid: {', '.join(WINDOW_UNITS)}")
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)

    def suffixes(j: int, k: int) -> list[tuple[int, ...]]:
        """(start, end) of the suffixes of trace j usable for slot k."""
        slots = [k] if matched else range(len(boundaries[j]))
        completion_len = len(traces[j]) - prompt_lens[j]
        out = []
        for m in slots:
            if m >= len(boundaries[j]):
                continue
            start = boundaries[j][m]
            if window <= 0:
                end = completion_len
            elif window_unit == "segments":
                end = boundaries[j][m + window] if m + window < len(boundaries[j]) else completion_len
            else:
                end = min(completion_len, start + window)
            if end > start:
                out.append((start, end))
        return out

    values = [torch.full((len(bounds),), float("nan")) for bounds in boundaries]
    probes: list[Probe] = []
    owners: list[tuple[int, int, int, float]] = []  # (trace, slot, suffix index in the slot, log q)
    log_w: dict[tuple[int, int], list[float]] = {}
    utilities: dict[tuple[int, int], list[float]] = {}
    for i, bounds in enumerate(boundaries):
        for k, b in enumerate(bounds):
            # Leave-one-out: the trace's own continuation (weight 1, utility R_i) is never evidence.
            usable = [(j, start, end) for j in members[groups[i]] if j != i for start, end in suffixes(j, k)]
            utilities_k = {float(rewards[j]) for j, _, _ in usable}
            if self_normalised and len(utilities_k) == 1:
                # Self-normalised weights sum to 1, so equal utilities give V = that utility
                # whatever the weights: nothing to score (every slot of a uniform group).
                values[i][k] = utilities_k.pop()
                continue
            mine = traces[i][: prompt_lens[i] + b]
            for j, start, end in usable:
                utilities.setdefault((i, k), []).append(float(rewards[j]))
                # Cut from the very state this prefix is: the current policy sampled it there, so
                # the weight is exactly 1. Scoring it would only add the sampler's and the scorer's
                # float noise, which the advantage's division by a group's spread of credits can
                # blow up (a group of identical chains: credits of 1e-7, divided by their std).
                same_state = traces[j][: prompt_lens[j] + start] == mine
                log_w.setdefault((i, k), []).append(0.0 if same_state else math.nan)
                if not same_state:
                    completion = traces[j][prompt_lens[j]:]
                    probes.append(Probe(trace=i, prefix_len=prompt_lens[i] + b, tokens=tuple(completion[start:end])))
                    owners.append((i, k, len(log_w[(i, k)]) - 1, float(sum(sampling_logprobs[j][start:end]))))
    logprobs = scorer(model, traces, probes, device=device, stats=stats) if probes else []
    for (i, k, index, log_q), lp in zip(owners, logprobs):
        log_w[(i, k)][index] = float(lp.sum()) - log_q
    for (i, k), lw in log_w.items():
        lw_t = torch.tensor(lw, dtype=torch.float64)
        if clip > 0:
            lw_t = torch.clamp(lw_t, max=float(torch.log(torch.tensor(clip, dtype=torch.float64))))
        u = torch.tensor(utilities[(i, k)], dtype=torch.float64)
        if self_normalised:
            weights = torch.softmax(lw_t, dim=0)  # w / sum(w), stable in log space
            values[i][k] = float((weights * u).sum())
        else:
            values[i][k] = min(float((torch.exp(lw_t) * u).mean()), float(u.max()))
    return values


@register_value_estimator("suffix_is")
def suffix_is_estimator(batch: CreditBatch, policy, offsets: list[list[int]], settings: ValueSettings) -> list[torch.Tensor]:
    """``suffix_is_values`` on a credit batch: the other group members' suffixes after each listed
    completion offset, weighted by the current policy (``policy.model``) against their sampling
    log-probs (``batch.old_logprobs``, required)."""
    if batch.old_logprobs is None:
        raise ValueError("suffix_is needs the sampling log-probs of the completions (batch.old_logprobs)")
    prompts, completions = batch.prompt_token_ids, batch.completion_token_ids
    traces = [list(p) + list(c) for p, c in zip(prompts, completions)]
    sampling = [batch.old_logprobs[i, : len(c)].tolist() for i, c in enumerate(completions)]
    return suffix_is_values(policy.model, traces, [len(p) for p in prompts], offsets, sampling,
                            batch.rewards.tolist(), batch.group_ids.tolist(), matched=settings.matched,
                            window=settings.window, window_unit=settings.window_unit,
                            self_normalised=settings.self_normalised, clip=settings.clip, device=policy.device,
                            stats=value_stats(batch), scorer=probe_scorer(settings.probe_scoring, auto="kv_cache"))
