"""``answer_probe``: the probability mass the model puts on verified answers if forced to answer
right after a prefix (RREDCoT's deterministic-support estimator, rredcot-method.md section 4.2).

    V(S_k) = sum_{y in D} pi(y | S_k, probe) * U(y)

D holds the gold answer and the distinct answers the group wrote and the verifier accepted, so
no generation is needed. Answers outside D that the verifier would accept carry probability the
estimate misses: its bias is non-positive, as the paper states.

``answer_probe_log_values`` runs the same probes and returns log V (ΔBelief-RL's log-belief of
the target answer, methods/delta_belief.py), so an unlikely answer does not underflow to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rredcot_cli.values.packing import Probe, cached_probe_logprobs


@dataclass(frozen=True)
class Candidate:
    context: tuple[int, ...]  # probe tokens before the answer (e.g. "Answer: "), not scored
    answer: tuple[int, ...]  # scored tokens: the answer and whatever closes it (EOS, "}$")
    utility: float


def probe_tokens(tokenizer, template: str, answer: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split ``template`` with ``answer`` filled in into the unscored context and the scored answer
    part; ``{eos}`` stands for the tokenizer's EOS token.

    The filled-in text head + answer + tail (head/tail: the template before/after ``{answer}``) is
    tokenised as one string, the way the model would read it, and the context is the longest common
    token prefix of that joint tokenisation and the head's own; the scored part is the rest of the
    joint tokens (the rule lm-evaluation-harness uses for context/continuation). Tokenising head and
    answer apart and concatenating the ids would score a token sequence the tokenizer never makes
    wherever a BPE merges across the join: "is " + "-3" gives ' ', '-', '3' where the text reads
    ' -', '3', and P(answer) falls by orders of magnitude. With this rule a space (or any head
    character) the BPE merges into the answer's first token is scored with it. A tokenizer that
    never merges across the join (e.g. one token per character) gets the head's tokens as the
    context and the answer + tail tokens as the scored part, as with separate tokenisation.
    ``{eos}`` is never merged: the text around it is tokenised piece by piece, EOS ids between."""
    if "{answer}" not in template:
        raise ValueError(f"answer probe template {template!r} has no {{answer}} placeholder")
    head, tail = template.split("{answer}", 1)

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(text.split("{eos}")):
            if i:
                ids.append(tokenizer.eos_token_id)
            if part:
                ids.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
        return ids

    head_ids, joint = encode(head), encode(head + answer + tail)
    shared = 0
    while shared < min(len(head_ids), len(joint)) and head_ids[shared] == joint[shared]:
        shared += 1
    return tuple(joint[:shared]), tuple(joint[shared:])


def answer_probe_values(
    model: torch.nn.Module,
    traces: list[list[int]],
    prefix_lens: list[list[int]],
    candidates: list[list[Candidate]],
    *,
    device: str = "cpu",
    stats: dict | None = None,
    scorer=cached_probe_logprobs,
) -> list[torch.Tensor]:
    """Values of every listed prefix of every trace.

    traces[i]: prompt + completion token ids; prefix_lens[i]: prefix lengths (in trace tokens)
    to evaluate; candidates[i]: the answer set D for trace i. Returns, per trace, a float32
    tensor (len(prefix_lens[i]),).
    """
    probes, owners = _probes(prefix_lens, candidates)
    logprobs = scorer(model, traces, probes, device=device, stats=stats)
    values = [torch.zeros(len(lens)) for lens in prefix_lens]
    for (i, slot, utility), lp in zip(owners, logprobs):
        values[i][slot] += float(torch.exp(lp.sum())) * utility
    return values


def answer_probe_log_values(
    model: torch.nn.Module,
    traces: list[list[int]],
    prefix_lens: list[list[int]],
    candidates: list[list[Candidate]],
    *,
    agg: str = "sum",
    device: str = "cpu",
    stats: dict | None = None,
    scorer=cached_probe_logprobs,
) -> list[torch.Tensor]:
    """The same probes as ``answer_probe_values``, in log space (no underflow for unlikely answers):

        log V(S_k) = log sum_{y in D} U(y) exp(s(y | S_k)),
        s = the summed (``agg="sum"``: log pi(y | S_k, probe)) or mean (``agg="mean"``) log-prob
            of the candidate's scored tokens.

    Arguments as in ``answer_probe_values``; returns, per trace, a float64 tensor
    (len(prefix_lens[i]),) of log-values (-inf where every candidate has utility 0)."""
    if agg not in ("sum", "mean"):
        raise ValueError(f"unknown agg {agg!r}; valid: sum, mean")
    probes, owners = _probes(prefix_lens, candidates)
    logprobs = scorer(model, traces, probes, device=device, stats=stats)
    terms: list[list[list[float]]] = [[[] for _ in lens] for lens in prefix_lens]
    for (i, slot, utility), lp in zip(owners, logprobs):
        if utility > 0:
            score = lp.double().sum() if agg == "sum" else lp.double().mean()
            terms[i][slot].append(float(score) + math.log(utility))
    return [torch.tensor([torch.logsumexp(torch.tensor(t, dtype=torch.float64), 0).item() if t else -math.inf
                          for t in row], dtype=torch.float64) for row in terms]


def _probes(prefix_lens: list[list[int]], candidates: list[list[Candidate]]) -> tuple[list[Probe], list[tuple]]:
    """One probe per (trace, prefix, candidate) and its owner (trace, prefix slot, utility)."""
    probes: list[Probe] = []
    owners: list[tuple[int, int, float]] = []  # (trace, prefix slot, utility)
    for i, lens in enumerate(prefix_lens):
        for slot, prefix_len in enumerate(lens):
            for cand in candidates[i]:
                probes.append(Probe(trace=i, prefix_len=prefix_len, tokens=cand.context + cand.answer,
                                    scored_from=len(cand.context)))
                owners.append((i, slot, cand.utility))
    return probes, owners
