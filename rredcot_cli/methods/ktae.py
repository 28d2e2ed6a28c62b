"""KTAE: Key-token Advantage Estimation (Sun, Yang, Jian, Du, Cui, Ren, Zhang, 2025, "KTAE: A
Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning", NeurIPS 2025,
arXiv 2505.16826; code: github.com/xiaolizh1/KTAE, read for this file:
``verl/workers/actor/compute_key_tokens.py`` and ``compute_ktae_outcome_advantage_and_keytokens``
in ``verl/trainer/ppo/core_algos.py``).

No model and no extra pass: statistics over each group's G completions. For every token id v
that occurs in the group, a 2x2 table over completions (occurrence x correctness, correct =
reward > ``correct_threshold``):

    a = correct completions containing v     b = incorrect completions containing v
    c = correct completions without v        d = incorrect completions without v      n = G

    p(v)   two-sided Fisher exact test p-value of the table (hypergeometric: the sum of the
           probabilities of the tables with the same margins that are no more likely than it)
    F(v)   = exp(-2 p(v)), and 0 when p(v) = 1                       (association, in (0, 1])
    IG(v)  = H(correct) - H(correct | contains v), in bits          (information gain)
    h(v)   = asin sqrt(a / (a + c)) - asin sqrt(b / (b + d))        (direction: half Cohen's h)
    tf_c(v)= f_c (k1 + 1) / (f_c + k1 (1 - b + b L_c / L)),  f_c = count of v in the correct
             completions / L_c, L_c = their total tokens, L = (L_c + L_w) / 2; tf_w likewise
             (BM25-style saturated term frequency)
    x(v)   = h(v) + gamma (tf_c / (tf_w + tf_eps) - tf_w / (tf_c + tf_eps))
    KT(v)  = top * (2 sigmoid((alpha F(v) + beta IG(v)) x(v) / (alpha + beta)) - 1)   in (-top, top)

    A_{i,t} = A_i + KT(y_{i,t})      A_i = GRPO (``scale_by_std``) or Dr. GRPO outcome advantage

A group with no correct or no incorrect completion (or of one completion) gets KT = 0, so its
advantage is GRPO's (0 for uniform groups). The key-token value is *added*, whatever the
completion's outcome: a token typical of correct completions is pushed up in wrong completions too.

Defaults are what the released code runs: its advantage function builds ``ComputeKeyTokens`` with
alpha = beta = gamma = top = 1 whatever the launcher sets (the launchers' ``beta_ig=2.0`` and
``bottom=-1.0`` never reach it; ``gamma_tf`` is used only as an on/off switch, here a weight, equal
for 0 and 1); k1 = 2, b = 0.5, tf_eps = 1e-5 and the 1e-10 in the rates are its constants.

Deviations, and why:
- The code zeroes KT of token id 151643 (Qwen's <|endoftext|>, its end of sequence). The credit
  batch carries no tokenizer, so ``zero_final_token`` zeroes KT at each completion's last position,
  where a finished completion's EOS sits (a truncated one loses KT on one ordinary token).
- Fisher's test in float64 with ties counted within a relative 1e-7 (as SciPy does), and p = 1
  within 1e-9 counted as 1; the code compares float32 sums exactly, so a rounding error can flip
  F(v) between 0 and exp(-2) there.
- Host advantage: GRPO / Dr. GRPO here; the paper's DAPO+KTAE host is ``method=dapo``'s advantage,
  not combined with KTAE in this file.
- Tokens of the embedded model are characters, so a "key token" is a character (a digit, an
  operator); the paper's tokens are BPE pieces. The statistics are unchanged.

Shapes: completion token ids (ragged, B rows) + rewards (B,) -> per group a table (V_g, 4) over
its V_g distinct token ids -> KT (V_g,) -> token advantages (B, T), exactly 0 on padding.
Credit: segment_credits = the mean token advantage over each segment, no values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._token_weights import reweighted_credit
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.grpo import grpo_advantage


@dataclass
class KTAEParams:
    alpha: float = 1.0  # weight of the Fisher-test association F
    beta: float = 1.0  # weight of the information gain IG
    gamma: float = 1.0  # weight of the term-frequency ratio in the direction x (0 = Cohen's h only)
    top: float = 1.0  # KT lies in (-top, top)
    k1: float = 2.0  # BM25 saturation
    b: float = 0.5  # BM25 length normalisation
    tf_eps: float = 1e-5  # in tf_c / (tf_w + tf_eps)
    rate_eps: float = 1e-10  # in a / (a + c + rate_eps)
    zero_final_token: bool = True  # KT = 0 at each completion's last token (its EOS)
    correct_threshold: float = 0.0  # correct = reward > this (the code: > 0)
    scale_by_std: bool = True  # host advantage: GRPO (true) | Dr. GRPO (false)
    eps: float = 1e-6  # added to the group's reward std (host advantage)


# Meaningful range of each numeric parameter (checked when the config is composed).
KTAE_RANGES = {
    "alpha": ">= 0",
    "beta": ">= 0",
    "gamma": ">= 0",
    "top": ">= 0",
    "k1": ">= 0",
    "b": "[0, 1]",
    "tf_eps": "> 0",
    "rate_eps": "> 0",
    "correct_threshold": "[0, 1)",
    "eps": "> 0",
}


def _log_comb(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_exact_p(table: torch.Tensor) -> torch.Tensor:
    """(N, 4) tables (a, b, c, d) -> (N,) two-sided Fisher exact p-values (float64).

    Rows: contains (a, b) / does not (c, d); columns: correct (a, c) / incorrect (b, d)."""
    t = table.to(torch.float64)
    a, b, c, d = t.unbind(1)
    r1, c1, n = a + b, a + c, a + b + c + d
    k_min = (r1 + c1 - n).clamp(min=0)
    k_max = torch.minimum(r1, c1)
    width = int(k_max.max().item()) + 1 if t.shape[0] else 1
    k = torch.arange(width, dtype=torch.float64)[None, :].expand(t.shape[0], -1)
    support = (k >= k_min[:, None]) & (k <= k_max[:, None])
    kk = torch.where(support, k, k_min[:, None])  # keep lgamma's arguments valid off the support
    log_p = _log_comb(c1[:, None], kk) + _log_comb((n - c1)[:, None], r1[:, None] - kk) - _log_comb(n, r1)[:, None]
    log_obs = _log_comb(c1, a) + _log_comb(n - c1, r1 - a) - _log_comb(n, r1)
    keep = support & (log_p <= log_obs[:, None] + math.log1p(1e-7))
    p = torch.where(keep, log_p.exp(), torch.zeros_like(log_p)).sum(1)
    return p.clamp(max=1.0)


def information_gain(table: torch.Tensor) -> torch.Tensor:
    """(N, 4) tables -> (N,) H(correct) - H(correct | contains), in bits (0 for an empty table)."""
    t = table.to(torch.float64)
    a, b, c, d = t.unbind(1)
    n = a + b + c + d

    def h(p: torch.Tensor) -> torch.Tensor:
        return torch.where(p > 0, -p * torch.log2(p.clamp(min=1e-300)), torch.zeros_like(p))

    def h2(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = x + y
        safe = total.clamp(min=1e-300)
        return torch.where(total > 0, h(x / safe) + h(y / safe), torch.zeros_like(total))

    safe_n = n.clamp(min=1e-300)
    ig = h2(a + c, b + d) - ((a + b) / safe_n) * h2(a, b) - ((c + d) / safe_n) * h2(c, d)
    return torch.where(n > 0, ig, torch.zeros_like(ig))


def saturated_tf(counts: torch.Tensor, total: float, other_total: float, *, k1: float, b: float) -> torch.Tensor:
    """(V,) token counts in one set of completions of ``total`` tokens -> BM25-style
    f (k1 + 1) / (f + k1 (1 - b + b total / avg)), f = counts / total, avg = mean of both totals."""
    f = counts.to(torch.float64) / max(total, 1e-300)
    avg = (total + other_total) / 2
    k = k1 * (1 - b + b * total / avg) if avg > 0 else k1
    return f * (k1 + 1) / (f + k).clamp(min=1e-300)


def key_token_values(table: torch.Tensor, correct_counts: torch.Tensor, wrong_counts: torch.Tensor,
                     correct_total: float, wrong_total: float, *, alpha: float, beta: float, gamma: float,
                     top: float, k1: float, b: float, tf_eps: float, rate_eps: float) -> torch.Tensor:
    """KT (V,) for V token ids from their tables (V, 4) and their counts in the correct / incorrect
    completions (V,) each (the module docstring's formulas)."""
    if alpha + beta <= 0:
        raise ValueError(f"ktae needs alpha + beta > 0, got alpha={alpha}, beta={beta}")
    t = table.to(torch.float64)
    a, bb, c, d = t.unbind(1)
    p = fisher_exact_p(t)
    fisher = torch.where(p >= 1 - 1e-9, torch.zeros_like(p), torch.exp(-2 * p))
    ig = information_gain(t)
    direction = torch.asin(torch.sqrt((a / (a + c + rate_eps)).clamp(0, 1))) - \
        torch.asin(torch.sqrt((bb / (bb + d + rate_eps)).clamp(0, 1)))
    if gamma:
        tf_c = saturated_tf(correct_counts, correct_total, wrong_total, k1=k1, b=b)
        tf_w = saturated_tf(wrong_counts, wrong_total, correct_total, k1=k1, b=b)
        direction = direction + gamma * (tf_c / (tf_w + tf_eps) - tf_w / (tf_c + tf_eps))
    score = (alpha * fisher + beta * ig) * direction / (alpha + beta)
    return top * (2 * torch.sigmoid(score) - 1)


def group_key_tokens(tokens: list[list[int]], correct: list[bool], **knobs) -> dict[int, float]:
    """Token id -> KT over one group's completions (empty when the group lacks correct or
    incorrect completions)."""
    n_correct = sum(correct)
    n_wrong = len(correct) - n_correct
    if n_correct == 0 or n_wrong == 0:
        return {}
    vocab = sorted({v for row in tokens for v in row})
    index = {v: j for j, v in enumerate(vocab)}
    table = torch.zeros(len(vocab), 4, dtype=torch.float64)
    counts = torch.zeros(2, len(vocab), dtype=torch.float64)
    totals = [0, 0]
    for row, ok in zip(tokens, correct):
        col = 0 if ok else 1
        totals[col] += len(row)
        for v in row:
            counts[col, index[v]] += 1
        for v in set(row):
            table[index[v], col] += 1
    table[:, 2] = n_correct - table[:, 0]
    table[:, 3] = n_wrong - table[:, 1]
    kt = key_token_values(table, counts[0], counts[1], float(totals[0]), float(totals[1]), **knobs)
    return dict(zip(vocab, kt.tolist()))


@register("ktae", params=KTAEParams, ranges=KTAE_RANGES)
def ktae(batch: CreditBatch, *, alpha: float, beta: float, gamma: float, top: float, k1: float, b: float,
         tf_eps: float, rate_eps: float, zero_final_token: bool, correct_threshold: float, scale_by_std: bool,
         eps: float) -> Credit:
    """GRPO advantage plus each token's key-token value from its group's statistics. Needs only
    ``batch.completion_token_ids`` and the rewards. Defaults of the keyword arguments live in
    ``KTAEParams``."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    mask = batch.token_mask
    kt = torch.zeros(mask.shape, dtype=torch.float32)
    knobs = dict(alpha=alpha, beta=beta, gamma=gamma, top=top, k1=k1, b=b, tf_eps=tf_eps, rate_eps=rate_eps)
    for g in batch.group_ids.unique():
        rows = (batch.group_ids == g).nonzero().flatten().tolist()
        tokens = [list(batch.completion_token_ids[i]) for i in rows]
        values = group_key_tokens(tokens, [float(batch.rewards[i]) > correct_threshold for i in rows], **knobs)
        if not values:
            continue
        for i, row in zip(rows, tokens):
            kt[i, : len(row)] = torch.tensor([values[v] for v in row], dtype=torch.float32)
            if zero_final_token and row:
                kt[i, len(row) - 1] = 0.0
    tokens = torch.where(mask, advantage[:, None] + kt, torch.zeros(()))
    # Unit "advantage" times the additive token advantages: reweighted_credit then only assembles
    # the Credit (0 on padding, segment credit = mean token advantage over the segment).
    return reweighted_credit(torch.ones_like(advantage), tokens, batch)
