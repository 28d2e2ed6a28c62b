"""The clipped-ratio policy-gradient loss shared by every credit method.

Credit methods only decide the per-token advantages; this loss is the same for all of them, so
a comparison between methods changes one thing at a time.

    ratio_t = exp(logp_t - old_logp_t)
    L_t     = -min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t) + kl_coef * KL_t

``clip_low``/``clip_high`` give DAPO's clip-higher when they differ (Yu et al., 2025,
arXiv 2503.14476). KL_t to a frozen reference uses Schulman's k1 (log ratio) or k3
(exp(-x) + x - 1 with x = logp - ref_logp, unbiased and non-negative) estimator.

Checked against verl's ``verl/trainer/ppo/core_algos.py`` (``compute_policy_loss`` /
``compute_policy_loss_vanilla``, ``kl_penalty``); where the defaults differ from verl's:

- Dual clip (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
  Learning", arXiv 1912.09729; verl's ``clip_ratio_c``, default 3.0 there): for A_t < 0 the loss
  is also capped at -clip_ratio_c * A_t, so a token whose ratio has grown far above 1 with a
  negative advantage adds a bounded loss and no gradient. Off here by default
  (``clip_ratio_c=0``, ``train.clip_ratio_c``): the plain PPO/GRPO clipped surrogate of the papers.
- k3 clamp: verl's ``low_var_kl`` clamps the k3 value to [-10, 10] (and, in recent versions, the
  log ratio to [-20, 20] before the exp); ``kl_clamp=c > 0`` (``train.kl_clamp=10`` for verl) does
  both, with c in place of 10. Off by default (``kl_clamp=0``): unclamped k3 is Schulman's
  estimator and keeps its gradient far from the reference (log p = -15 against a reference at 0
  gives k3 = 3.3e6 and a large pull back; clamped, 10 and no gradient).
- verl also clamps the PPO log ratio logp - old_logp to [-20, 20] before the exp; this loss does
  not (a ratio beyond e^20 is clipped for A > 0 and, with A < 0, is what the dual clip bounds).

Checked against TRL 1.16's ``GRPOTrainer._compute_loss`` too (tests/train/test_oracle_trl_loss.py,
values and gradients): ``loss_agg`` seq-mean-token-mean, token-mean and constant are its loss_type
"grpo", "dapo" and "dr_grpo", micro-batches included ("bnpo" is token-mean only within one
micro-batch: accumulated, it averages the micro-batches' token means); ``clip_ratio_c = c`` gives
the same loss as its two-sided clip ``delta = c`` (INTELLECT-2) whenever c > 1 + clip_high;
``sampler_weights`` enter as its ``importance_sampling_ratio`` does. Where it differs: TRL 1.16
defaults to ``use_bias_correction_kl=True``, the KL term times the ratio (DeepSeek-V3.2), which
changes the KL gradient even on-policy; here the KL term is never weighted (TRL's ``False``). TRL
never clamps k3 (``kl_clamp=0``, the default here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "constant")
KL_ESTIMATORS = ("k1", "k3")
SAMPLER_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask",
                       "geometric_mask")


@dataclass
class LossStats:
    loss: float
    clip_fraction: float  # fraction of tokens whose ratio was clipped
    approx_kl_old: float  # mean (old_logp - logp): how far the update moved from the sampler
    kl_ref: float  # mean KL estimate to the reference (0 without one)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str,
                clamp: float = 0.0) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate on sampled tokens; (B, T) -> (B, T).

    ``clamp`` > 0 (k3 only) computes verl's ``low_var_kl``: x = ref_logp - logp clamped to
    [-20, 20], k3 = exp(x) - x - 1 clamped to [-clamp, clamp] (verl: 10); 0 leaves k3 unclamped."""
    if clamp < 0:
        raise ValueError(f"kl clamp must be >= 0 (0 turns it off), got {clamp}")
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        if clamp > 0:
            x = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
            return (torch.exp(x) - x - 1.0).clamp(-clamp, clamp)
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def sampler_correction_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> torch.Tensor:
    """Importance weights for the sampler/trainer mismatch, (B, T), 0 on padding.

    The completions were drawn by the sampler (vLLM kernels, another batch shape, another
    precision) with log-probs ``sampler_logprobs``, while the PPO ratio is taken against the
    trainer's own ``old_logprobs`` of the same tokens. The ratio rho = pi_old / pi_sampler corrects
    the policy gradient back to an on-policy estimate; capping it bounds its variance (truncated
    importance sampling, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training"; TRL's ``vllm_importance_sampling_*`` modes):

    token_truncate     min(rho_t, cap) per token (token-level truncated IS, "TIS")
    token_mask         rho_t per token, 0 where rho_t > cap: cap-and-mask, a token past the cap
                       is dropped instead of truncated (token-level masked IS, "MIS", Liu, Li et
                       al. 2025, "When Speed Kills Stability")
    sequence_truncate  min(rho, cap) with rho = prod_t rho_t, the same for every token of a row
    sequence_mask      rho for the whole row, 0 for every token of a row whose rho > cap
                       (sequence-level MIS, ibid.)
    geometric_mask     1 for every token of a row whose geometric-mean ratio
                       g = exp(mean_t log rho_t) lies in [1 / cap, cap], 0 for every token of a
                       row outside it: a two-sided rejection mask, no reweighting, that does not
                       grow with the row's length as prod_t rho_t does (ibid., "Geo-Mask"; verl's
                       rollout correction, ``rollout_rs="geometric"`` without IS weights, with
                       lower bound 1 / cap). Needs cap > 1.
    none               1

    old_logprobs, sampler_logprobs: (B, T); mask: (B, T) bool, True on completion tokens; the
    weights carry no gradient.
    """
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"unknown sampler correction {mode!r}; valid: {', '.join(SAMPLER_CORRECTIONS)}")
    maskf = mask.to(old_logprobs.dtype)
    if mode == "none":
        return maskf
    log_rho = (old_logprobs.detach() - sampler_logprobs.detach()) * maskf
    if mode == "geometric_mask":
        return geometric_mask(log_rho, maskf, cap)
    if mode.startswith("sequence"):
        log_rho = log_rho.sum(-1, keepdim=True).expand_as(log_rho)
    rho = torch.exp(log_rho.clamp(max=50.0))  # exp(50) is far above any cap: masked or truncated anyway
    weights = rho.clamp(max=cap) if mode.endswith("truncate") else torch.where(rho > cap, torch.zeros_like(rho), rho)
    return weights * maskf


def geometric_mask(log_rho: torch.Tensor, maskf: torch.Tensor, cap: float) -> torch.Tensor:
    """``geometric_mask``'s (B, T) weights from the (B, T) log ratios ``log_rho`` (0 on padding)
    and the float mask: 1 on the completion tokens of a row whose mean log ratio lies in
    [-log cap, log cap] (geometric mean in [1 / cap, cap]), else 0. A row without tokens gets 0."""
    if not cap > 1.0:
        raise ValueError(f"geometric_mask needs a cap > 1 (kept rows: geometric-mean ratio in [1/cap, cap]), got {cap}")
    tokens = maskf.sum(-1, keepdim=True)
    mean_log_rho = log_rho.sum(-1, keepdim=True) / tokens.clamp(min=1.0)
    bound = torch.log(torch.tensor(cap, dtype=torch.float64)).item()
    keep = (mean_log_rho.abs() <= bound) & (tokens > 0)
    return keep.to(maskf.dtype).expand_as(maskf) * maskf


def loss_normalizer(mask: torch.Tensor, mode: str, max_tokens: int | None = None) -> float:
    """What ``aggregate`` divides by for the rows of ``mask`` (B, T): the token count
    (token-mean), the sequence count (seq-mean-token-mean) or sequences x the generation budget
    (constant). Computed once over a whole minibatch and handed to ``aggregate`` for each of its
    micro-batches (or ranks), the summed micro-batch losses equal the minibatch loss exactly."""
    if mode == "token-mean":
        return float(mask.sum().clamp(min=1))
    if mode == "seq-mean-token-mean":
        return float(max(1, mask.shape[0]))
    if mode == "constant":
        if not max_tokens:
            raise ValueError("loss_agg='constant' needs max_tokens (the generation budget)")
        return float(mask.shape[0] * max_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(LOSS_AGGREGATIONS)}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_tokens: int | None = None,
              normalizer: float | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the positions where ``mask`` is True.

    token-mean          sum over all tokens / number of tokens (DAPO)
    seq-mean-token-mean mean over sequences of each sequence's token mean (GRPO paper)
    constant            sum over all tokens / (B * max_tokens) (Dr. GRPO: no length bias)

    ``normalizer`` replaces the denominator computed from these rows: pass the
    ``loss_normalizer`` of the whole minibatch when these rows are one micro-batch of it.
    """
    mask = mask.to(per_token.dtype)
    if normalizer is None:
        normalizer = loss_normalizer(mask, mode, max_tokens)
    if mode in ("token-mean", "constant"):
        return (per_token * mask).sum() / normalizer
    if mode == "seq-mean-token-mean":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / normalizer
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(LOSS_AGGREGATIONS)}")


@dataclass(frozen=True)
class LossSettings:
    """What the clipped-ratio loss computes (the ``train.*`` options of the same names).

    ``clip_low``/``clip_high``: the ratio's clip range ``[1 - clip_low, 1 + clip_high]``;
    ``loss_agg`` and ``max_tokens`` (the generation budget, for ``constant``): the normaliser
    (``loss_normalizer``); ``kl_coef`` x the ``kl_estimator`` (k1/k3) KL to the reference, k3
    clamped to ``[-kl_clamp, kl_clamp]`` (0: off, ``kl_estimate``); ``clip_ratio_c``: the dual
    clip for negative advantages (0: off; module docstring)."""

    clip_low: float
    clip_high: float
    loss_agg: str
    max_tokens: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_clamp: float = 0.0
    clip_ratio_c: float = 0.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampler_weights: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate loss. All tensors are (B, T); ``mask`` is True on completion tokens.

    ``settings.clip_ratio_c`` > 1 turns on the dual clip (module docstring): where A_t < 0 the
    per-token loss is min(-clip_ratio_c * A_t, max(-ratio_t A_t, -clip(ratio_t) A_t)); 0 turns it
    off. ``settings.kl_clamp`` clamps the k3 estimate (``kl_estimate``); 0 turns it off.

    Gradients flow through ``logprobs`` only; old/ref log-probs and advantages are constants.
    ``sampler_weights`` (``sampler_correction_weights``) multiply the policy-gradient term of
    each token (not the KL term, which is an estimate under the current policy, as in TRL);
    ``normalizer`` is the minibatch's ``loss_normalizer`` when these rows are a micro-batch.
    ``token_weights`` (B, T), a credit method's token selection (``UpdateHyper.token_selection``),
    multiply the policy-gradient term the same way and leave the normaliser alone: a token left
    out still counts in the token mean, as in TRL's ``top_entropy_quantile``.
    """
    mask = mask.bool()
    old_logprobs = old_logprobs.detach()
    advantages = advantages.detach()
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if settings.clip_ratio_c:
        if not settings.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual clip) or 0 (off), got {settings.clip_ratio_c}")
        dual = torch.minimum(per_token, -advantages * settings.clip_ratio_c)
        per_token = torch.where(advantages < 0, dual, per_token)
    if sampler_weights is not None:
        per_token = per_token * sampler_weights.detach()
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(per_token.dtype)

    kl_ref = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None and settings.kl_coef != 0.0:
        kl = kl_estimate(logprobs, ref_logprobs.detach(), settings.kl_estimator, settings.kl_clamp)
        per_token = per_token + settings.kl_coef * kl
        kl_ref = (kl.detach() * mask).sum() / mask.sum().clamp(min=1)

    loss = aggregate(per_token, mask, settings.loss_agg, settings.max_tokens, normalizer)
    with torch.no_grad():
        n_tokens = mask.sum().clamp(min=1)
        was_clipped = (clipped < unclipped) & mask
        stats = LossStats(
            loss=float(loss.detach()),
            clip_fraction=float(was_clipped.sum() / n_tokens),
            approx_kl_old=float(((old_logprobs - logprobs.detach()) * mask).sum() / n_tokens),
            kl_ref=float(kl_ref),
        )
    return loss, stats
