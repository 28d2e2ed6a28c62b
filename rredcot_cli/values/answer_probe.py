"""``answer_probe``: the probability mass the model puts on verified answers if forced to answer
right after a prefix (RREDCoT's deterministic-support estimator, docs/design/rredcot-method.md section 4.2).

    V(S_k) = sum_{y in D} pi(y | S_k, probe) * U(y)

D holds the gold answer and the distinct answers the *other* members of the group wrote and the
verifier accepted, so no generation is needed. Answers outside D that the verifier would accept
carry probability the estimate misses: its bias is non-positive, as the paper states. Leave-one-out
(issue 37): a trace's own answer enters its D only when another member wrote it too, so flipping
its own reward moves none of its values (before, a correct trace's own surface form was a candidate
with utility R_i).

``answer_share`` (registered beside it) normalises the same probes over every answer the others
wrote, right or wrong, with the gold:

    V(S_k) = sum_{y in D} pi(y | S_k, probe) U(y) / sum_{y in A} pi(y | S_k, probe),   A = D + the others' wrong answers

the share of the model's forced-answer mass, among the answers its group actually reached, that
goes to a correct one. A small model puts little absolute mass on any forced answer mid-chain (the
format, not the belief), which the ratio cancels; with no wrong answer among the others there is
nothing to compare against, and the boundary has no estimate (NaN).

``answer_probe_log_values`` runs the same probes and returns log V (ΔBelief-RL's log-belief of
the target answer, methods/delta_belief.py), so an unlikely answer does not underflow to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.values.packing import Probe, cached_probe_logprobs, probe_scorer, value_stats
from rredcot_cli.values.registry import ValueSettings, register_value_estimator


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


def others_answers(batch: CreditBatch) -> list[dict[str, float]]:
    """Per trace i: {answer text: utility} of the gold answer (1) and the answers written by the other
    members of its group (their rewards), never trace i's own unless another member wrote it too."""
    gold = batch.extras["gold_answers"]
    preds = batch.extras["pred_answers"]
    groups = batch.group_ids.tolist()
    rewards = batch.rewards.tolist()
    out = []
    for i, g in enumerate(groups):
        answers = {str(gold[i]).strip(): 1.0}
        for j, h in enumerate(groups):
            if j != i and h == g and preds[j] is not None:
                text = str(preds[j]).strip()
                answers[text] = max(answers.get(text, 0.0), float(rewards[j]))
        out.append(answers)
    return out


def forced_answer_template(batch: CreditBatch, settings: ValueSettings) -> str:
    template = settings.probe_template or (batch.extras or {}).get("answer_probe")
    if not template:
        raise ValueError("answer_probe needs a forced-answer template: set method.probe_template")
    return template


def _candidates(batch: CreditBatch, tokenizer, template: str, *, correct_only: bool) -> list[list[Candidate]]:
    out = []
    for answers in others_answers(batch):
        cands = []
        for answer, utility in answers.items():
            if correct_only and utility <= 0.5:
                continue  # 0/1 rewards: a wrong answer adds nothing to V
            context, scored = probe_tokens(tokenizer, template, answer)
            cands.append(Candidate(context=context, answer=scored, utility=utility))
        out.append(cands)
    return out


def _prefix_lens(batch: CreditBatch, offsets: list[list[int]]) -> list[list[int]]:
    return [[len(batch.prompt_token_ids[i]) + o for o in offs] for i, offs in enumerate(offsets)]


def _traces(batch: CreditBatch) -> list[list[int]]:
    return [list(p) + list(c) for p, c in zip(batch.prompt_token_ids, batch.completion_token_ids)]


@register_value_estimator("answer_probe", forced_answer=True)
def answer_probe_estimator(batch: CreditBatch, policy, offsets: list[list[int]],
                           settings: ValueSettings) -> list[torch.Tensor]:
    """``answer_probe_values`` with D = the gold and the other members' verified answers."""
    template = forced_answer_template(batch, settings)
    candidates = _candidates(batch, policy.tokenizer, template, correct_only=True)
    # packed: the cheapest on short traces (docs/studies/rredcot-value-cost.md) and on ~1k-token
    # chains too (results/real-model-speed/long-credit: 32 CPU s against the KV-cache scorer's 76)
    return answer_probe_values(policy.model, _traces(batch), _prefix_lens(batch, offsets), candidates,
                               device=policy.device, stats=value_stats(batch),
                               scorer=probe_scorer(settings.probe_scoring, auto="packed"))


@register_value_estimator("answer_share", forced_answer=True)
def answer_share_estimator(batch: CreditBatch, policy, offsets: list[list[int]],
                           settings: ValueSettings) -> list[torch.Tensor]:
    """The forced-answer mass on correct answers over the mass on every answer the others reached
    (module docstring); NaN for a trace whose group mates wrote no wrong answer."""
    template = forced_answer_template(batch, settings)
    candidates = _candidates(batch, policy.tokenizer, template, correct_only=False)
    probes, owners = _probes(_prefix_lens(batch, offsets), candidates)
    scorer = probe_scorer(settings.probe_scoring, auto="packed")
    logprobs = scorer(policy.model, _traces(batch), probes, device=policy.device, stats=value_stats(batch))
    correct = [[[] for _ in offs] for offs in offsets]
    every = [[[] for _ in offs] for offs in offsets]
    for (i, slot, utility), lp in zip(owners, logprobs):
        score = float(lp.double().sum())
        every[i][slot].append(score)
        if utility > 0:
            correct[i][slot].append(score + math.log(utility))
    values = []
    for i, offs in enumerate(offsets):
        has_wrong = any(c.utility <= 0.5 for c in candidates[i])
        row = torch.full((len(offs),), float("nan"))
        if has_wrong:
            for slot in range(len(offs)):
                num = torch.logsumexp(torch.tensor(correct[i][slot], dtype=torch.float64), 0)
                den = torch.logsumexp(torch.tensor(every[i][slot], dtype=torch.float64), 0)
                row[slot] = float(torch.exp(num - den))
        values.append(row)
    return values
