"""A learned value function V(s_t) -- the critic of PPO with GAE.

The critic is a copy of the policy's transformer body (the decoder without its LM head) plus a
linear head on the last hidden layer: ``V(s_t) = head(h_t)``, where ``h_t`` is the hidden state
of the last token of ``s_t = prompt + completion[:t]``. It is initialised from the policy's
weights, as in VinePPO's PPO baseline (Kazemnejad et al., "VinePPO: Unlocking RL Potential for
LLM Reasoning Through Refined Credit Assignment", arXiv 2410.01679), and the head starts at
zero, so an untrained critic predicts V = 0 everywhere.

The training stage owns it: every step it asks for ``values`` of the sampled batch (the
``old_values`` of GAE, verl's ``compute_gae_advantage_return``), and after the policy update it
``fit``s them to the GAE returns R_t with the clipped value loss of PPO (Schulman et al. 2017,
"Proximal Policy Optimization Algorithms"; Huang et al., "The 37 implementation details of
PPO"; verl's ``compute_value_loss``), averaged over the valid (completion) tokens::

    L = 0.5 * mean_t max( (V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2 )

with ``c = value_clip`` (``value_clip <= 0``: the plain ``0.5 * (V_t - R_t)^2``).

Cost: a second trainable model of the policy's size (a full copy of its body) plus its AdamW
state (two more copies), and one forward pass over the batch for ``values`` plus a forward and
backward pass per minibatch step in ``fit``.

Rows are packed like the policy's (``rredcot_cli/policy/hf.py``): ``[left pad | prompt | completion |
right pad]`` with position ids counting real tokens only, so a row's values do not depend on
what it is batched with.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rredcot_cli.errors import ConfigError
from rredcot_cli.policy.logprobs import pack_prompt_completion
from rredcot_cli.store.atomic import atomic_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from rredcot_cli.config.schema import CriticConfig


@dataclass
class CriticStats:
    value_loss: float  # mean over the minibatch steps taken (NaN if none)
    clip_fraction: float  # fraction of valid tokens where the clipped value term was the larger (mean over steps taken)
    explained_variance: float  # 1 - Var(R - V_old) / Var(R) over valid tokens, before fitting; NaN if Var(R) == 0
    grad_norm: float  # mean gradient norm before clipping over the steps taken (NaN if none)
    updates: int  # minibatch steps taken
    skipped: int  # minibatch steps skipped because the loss or the gradient was not finite (weights untouched)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, float]:
    """PPO's clipped value loss and its clip fraction.

    ``values``, ``old_values``, ``returns``: (B, T); ``mask``: (B, T) bool, True on valid tokens.
    Returns ``0.5 * mean over valid tokens of max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``
    (a scalar tensor, differentiable in ``values``) and the fraction of valid tokens where the
    clipped term is strictly larger (verl's ``vf_clipfrac``). With ``value_clip <= 0`` the loss is
    ``0.5 * mean (V - R)^2`` and the clip fraction 0. Padding never contributes, even if it holds
    NaN. No valid token: loss 0, clip fraction 0.
    """
    mask = mask.bool()
    count = mask.sum().clamp(min=1)
    # Padding is zeroed before any arithmetic, not only after: a NaN there would otherwise leak
    # into the gradient (0 * NaN) even though the loss itself masks it out.
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    values = torch.where(mask, values, zero)
    old_values = torch.where(mask, old_values.to(values.dtype), zero)
    returns = torch.where(mask, returns.to(values.dtype), zero)
    unclipped = (values - returns) ** 2
    if value_clip > 0:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clip_fraction = float(((clipped > unclipped) & mask).sum() / count)
    else:
        per_token = unclipped
        clip_fraction = 0.0
    loss = 0.5 * torch.where(mask, per_token, torch.zeros_like(per_token)).sum() / count
    return loss, clip_fraction


def explained_variance(old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid tokens (population variances; the n/(n-1)
    correction would cancel in the ratio). 1 = perfect prediction, 0 = no better than the mean
    of R, negative = worse. NaN when Var(R) is 0 or there is no valid token."""
    mask = mask.bool()
    r = returns[mask].double()
    if r.numel() == 0:
        return float("nan")
    var_r = float(r.var(unbiased=False))
    if var_r == 0.0:
        return float("nan")
    residual = (r - old_values[mask].double()).var(unbiased=False)
    return 1.0 - float(residual) / var_r


class _ValueModel(nn.Module):
    """The critic's weights: ``backbone`` (a transformers decoder body) and ``head`` (hidden -> 1)."""

    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.head(hidden).squeeze(-1)  # (B, L)


class ValueCritic:
    """V(s_t) = head(h_t): a copy of the policy's decoder (transformer body without LM head) plus
    a linear head on its last hidden state, trained with PPO's clipped value loss.

    ``backbone`` is called as ``backbone(input_ids=, attention_mask=, position_ids=,
    use_cache=False).last_hidden_state`` (any transformers base model). The head is created here
    with zero weight and bias on the backbone's device and dtype, so until the first ``fit`` the
    critic says V = 0 everywhere and PPO's first advantages are the plain returns (the REINFORCE
    signal). Optimizer: AdamW(lr, weight_decay) over backbone and head. Minibatch order comes from
    the critic's own ``torch.Generator`` seeded with ``seed``, saved in ``state_dict`` so a
    resumed run shuffles as an uninterrupted one would.
    """

    def __init__(
        self,
        backbone: nn.Module,
        hidden_size: int,
        *,
        pad_id: int,
        lr: float = 1e-5,
        updates_per_batch: int = 2,
        minibatch_size: int = 32,
        value_clip: float = 0.2,
        grad_clip: float = 1.0,
        weight_decay: float = 0.0,
        seed: int = 0,
    ):
        if minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {minibatch_size}")
        if updates_per_batch < 0:
            raise ValueError(f"updates_per_batch must be >= 0, got {updates_per_batch}")
        first = next(backbone.parameters())
        head = nn.Linear(hidden_size, 1, device=first.device, dtype=first.dtype)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.module = _ValueModel(backbone, head).eval()
        self.hidden_size = int(hidden_size)
        self.pad_id = pad_id
        self.lr = lr
        self.updates_per_batch = updates_per_batch
        self.minibatch_size = minibatch_size
        self.value_clip = value_clip
        self.grad_clip = grad_clip
        self.weight_decay = weight_decay
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr, weight_decay=weight_decay)
        self.generator = torch.Generator().manual_seed(seed)

    @classmethod
    def from_policy(cls, model: "PreTrainedModel", *, pad_id: int, **hparams) -> "ValueCritic":
        """A critic whose body is a deep copy of ``model``'s decoder (``model.get_decoder()``, else
        ``model.base_model``), on the model's device and in its dtype, and whose head is zero, so
        the untrained critic says V = 0 everywhere (PPO's first step sees A_t = R, the REINFORCE
        signal). The copy is independent: training one never moves the other. ``hparams`` are
        those of ``ValueCritic``."""
        backbone = None
        get_decoder = getattr(model, "get_decoder", None)
        if callable(get_decoder):
            try:
                backbone = get_decoder()
            except (AttributeError, NotImplementedError, ValueError):
                backbone = None
        if backbone is None or backbone is model:
            backbone = getattr(model, "base_model", None)
        if backbone is None or backbone is model:
            raise ValueError(f"cannot find the decoder body of {type(model).__name__} to build a critic from")
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return cls(copy.deepcopy(backbone), int(config.hidden_size), pad_id=pad_id, **hparams)

    # ------------------------------------------------------------------ forward

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _forward(self, prompt_ids, completion_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) values (float32, on the critic's device, with grad if enabled; 0 on padding) and
        the (B, T) bool mask of valid tokens, T = the longest completion of these rows."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token (V(s_0) is read at the prompt's last token)")
        input_ids, attention_mask, mask, width_p = pack_prompt_completion(prompt_ids, completion_ids, self.pad_id)
        batch, width_t = mask.shape
        device = self.device
        mask = mask.to(device)
        if width_t == 0:
            return torch.zeros((batch, 0), device=device), mask
        # V(s_t) is read at column P-1+t, t < T: the last column (P+T-1) is never needed, and
        # attention is causal, so it is not fed at all.
        input_ids = input_ids[:, :-1].to(device)
        attention_mask = attention_mask[:, :-1].to(device)
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        out = self.module(input_ids, attention_mask, position_ids)  # (B, P+T-1)
        values = out[:, width_p - 1 :].float()  # (B, T)
        return torch.where(mask, values, torch.zeros_like(values)), mask

    @torch.no_grad()
    def values(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> torch.Tensor:
        """(B, T) float32 CPU tensor, T = the longest completion: ``V(s_t)`` for t = 0..T-1 with
        ``s_t = prompt + completion[:t]`` (the head on the hidden state at column P-1+t of the
        packed row); exactly 0 on padding. Eval mode, no gradient, ``minibatch_size`` rows at a
        time."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
        B = len(completion_ids)
        T = max((len(c) for c in completion_ids), default=0)
        out = torch.zeros(B, T)
        was_training = self.module.training
        self.module.eval()
        try:
            for start in range(0, B, self.minibatch_size):
                end = min(B, start + self.minibatch_size)
                v, _ = self._forward(prompt_ids[start:end], completion_ids[start:end])
                out[start:end, : v.shape[1]] = v.cpu()
        finally:
            self.module.train(was_training)
        return out

    # ------------------------------------------------------------------ training

    def fit(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        old_values: torch.Tensor,
        returns: torch.Tensor,
    ) -> CriticStats:
        """``updates_per_batch`` passes over the batch in shuffled minibatches of the clipped value
        loss (see ``value_loss``) towards ``returns``.

        ``old_values`` (the critic's ``values`` when the batch was sampled) and ``returns``: (B, T)
        CPU float32, T = the longest completion, 0 on padding. A minibatch whose loss or gradient
        norm is not finite changes nothing (no optimizer step) and is counted in ``skipped``, as in
        ``update.policy_update``. ``explained_variance`` is that of ``old_values``, before fitting.
        """
        B = len(completion_ids)
        if len(prompt_ids) != B:
            raise ValueError(f"{len(prompt_ids)} prompts but {B} completions")
        T = max((len(c) for c in completion_ids), default=0)
        for name, tensor in (("old_values", old_values), ("returns", returns)):
            if tuple(tensor.shape) != (B, T):
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected (B, T) = {(B, T)}")
        old_values = old_values.detach().float().cpu()
        returns = returns.detach().float().cpu()
        full_mask = torch.zeros(B, T, dtype=torch.bool)
        for i, c in enumerate(completion_ids):
            full_mask[i, : len(c)] = True
        ev = explained_variance(old_values, returns, full_mask)

        params = list(self.module.parameters())
        totals = {"value_loss": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        steps = skipped = 0
        self.module.train()
        try:
            for _ in range(self.updates_per_batch):
                order = torch.randperm(B, generator=self.generator).tolist()
                for start in range(0, B, self.minibatch_size):
                    idx = order[start : start + self.minibatch_size]
                    values, mask = self._forward([prompt_ids[i] for i in idx], [completion_ids[i] for i in idx])
                    t = values.shape[1]  # the minibatch's longest completion
                    loss, clip_fraction = value_loss(
                        values,
                        old_values[idx, :t].to(values.device),
                        returns[idx, :t].to(values.device),
                        mask,
                        self.value_clip,
                    )
                    self.optimizer.zero_grad(set_to_none=True)
                    if not torch.isfinite(loss):
                        skipped += 1
                        continue
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        params, self.grad_clip if self.grad_clip > 0 else float("inf")
                    )
                    if not torch.isfinite(grad_norm):
                        # A finite loss can still have an inf/NaN gradient; one such step would
                        # poison the weights and the AdamW moments for good.
                        self.optimizer.zero_grad(set_to_none=True)
                        skipped += 1
                        continue
                    self.optimizer.step()
                    steps += 1
                    totals["value_loss"] += float(loss.detach())
                    totals["clip_fraction"] += clip_fraction
                    totals["grad_norm"] += float(grad_norm)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.module.eval()
        mean = {k: v / steps if steps else float("nan") for k, v in totals.items()}
        return CriticStats(explained_variance=ev, updates=steps, skipped=skipped, **mean)

    # ------------------------------------------------------------------ state

    def _weights_cpu(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    def state_dict(self) -> dict:
        """Everything a resumed run needs: ``{"weights", "optimizer", "generator"}``, CPU tensors
        and plain containers only, so ``torch.load(weights_only=True)`` reads it back."""
        return {
            "weights": self._weights_cpu(),
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (weights, AdamW moments, shuffling generator)."""
        missing = [k for k in ("weights", "optimizer", "generator") if k not in state]
        if missing:
            raise ValueError(f"critic state lacks {missing}")
        self._load_weights(state["weights"], "the critic state")
        # Deep-copied: Optimizer.load_state_dict keeps same-device tensors as they are, so the
        # live moments would otherwise alias (and update in place) the caller's dict.
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.generator.set_state(state["generator"])

    def save_weights(self, path: str | Path) -> None:
        """``{"weights", "hidden_size"}`` to ``path`` with ``torch.save``, atomically (a reader
        never sees a half-written file)."""
        payload = {"weights": self._weights_cpu(), "hidden_size": self.hidden_size}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    def load_weights(self, path: str | Path) -> None:
        """Load a file written by ``save_weights``; ``ValueError`` naming ``path`` if it is not
        such a file or its weights do not fit this critic (other keys or shapes)."""
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt or foreign file: say which
            raise ValueError(f"{path} is not a critic weights file ({type(e).__name__}: {e})") from e
        if not isinstance(payload, dict) or not isinstance(payload.get("weights"), dict):
            raise ValueError(f"{path} is not a critic weights file (no 'weights' dict)")
        hidden = payload.get("hidden_size")
        if hidden is not None and int(hidden) != self.hidden_size:
            raise ValueError(f"{path} holds a critic of hidden size {hidden}, this one has {self.hidden_size}")
        self._load_weights(payload["weights"], str(path))

    def _load_weights(self, weights: dict, where: str) -> None:
        own = self.module.state_dict()
        missing = sorted(set(own) - set(weights))
        unexpected = sorted(set(weights) - set(own))
        shapes = [f"{k} {tuple(weights[k].shape)} vs {tuple(own[k].shape)}"
                  for k in sorted(set(own) & set(weights)) if tuple(weights[k].shape) != tuple(own[k].shape)]
        if missing or unexpected or shapes:
            raise ValueError(f"{where} does not fit this critic: missing {missing[:3]} ({len(missing)}), "
                             f"unexpected {unexpected[:3]} ({len(unexpected)}), shape mismatch {shapes[:3]}")
        self.module.load_state_dict(weights, strict=True)  # copies into the existing device/dtype


def build_critic(settings: CriticConfig, policy, seed: int) -> ValueCritic:
    """A ``ValueCritic`` on a copy of ``policy``'s body, from ``settings.init`` (``critic.init``):
    "policy" (zero value head) or a critic.pt written by ``rredcot train``; a missing or foreign
    file is a one-line ``ConfigError``."""
    c = settings
    critic = ValueCritic.from_policy(policy.model, pad_id=policy.tokenizer.pad_token_id, lr=c.lr,
                                     updates_per_batch=c.updates_per_batch, minibatch_size=c.minibatch_size,
                                     value_clip=c.value_clip, grad_clip=c.grad_clip, weight_decay=c.weight_decay,
                                     seed=seed)
    if c.init != "policy":
        if not Path(c.init).is_file():
            raise ConfigError(f"critic.init={c.init}: no such file; use critic.init=policy or the critic.pt "
                              f"of a ppo run (RUN/train/checkpoints/final/critic.pt)")
        try:
            critic.load_weights(c.init)
        except ValueError as e:
            raise ConfigError(f"critic.init={c.init}: {e}; it must be the critic.pt of a ppo run with this model") from e
    return critic

def _to_cpu(obj):
    """``obj`` with every tensor copied to CPU (containers rebuilt, other values kept): a copy, so
    a saved state never aliases the live optimizer moments that later steps update in place."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    return obj
