"""Teacher-forced log-probs of completion tokens: the one function the trainer, the scorers and
the HF backend share.

Sequence layout (one row per completion)::

    [pad ... pad | prompt tokens | completion tokens | pad ... pad]
     <-- left padded to P -------> <-- right padded to T -------->

so every completion starts at column P and its log-probs are a plain slice of the logits.
Position ids count real tokens only (``cumsum(attention_mask) - 1``), so a row gives the same
log-probs whatever it is batched with.

Two things matter at real-model scale and are handled here:

* **The distribution that sampled.** With ``temperature`` and ``top_p`` the log-prob of a token is
  taken under ``softmax(logits / temperature)`` restricted to the top-p nucleus, the distribution
  the sampler drew it from (vLLM's ``processed_logprobs``, transformers' warpers), so the PPO
  ratio compares like with like (TRL issue #4159 is what happens otherwise). The nucleus is
  computed without gradient, as both samplers do; the sampled token is always kept in it, so a
  token that a sampler with slightly different numerics put just inside the nucleus does not get
  log-prob -inf here.
* **Memory.** A vocabulary of 150k tokens makes ``(B, T, V)`` fp32 logits the largest tensor of
  an update (4k tokens x 152k x 4 bytes = 2.5 GB per sequence, twice over for log_softmax).
  With ``chunk_tokens`` the decoder body runs once and the LM head, softmax and gather run over
  ``chunk_tokens`` completion positions at a time; under autograd each chunk is checkpointed, so
  backward recomputes that chunk's logits instead of keeping all of them, and the log-softmax +
  gather's backward (``LogSoftmaxGather``) turns the log-softmax into the logits' gradient in
  place instead of allocating two more (N, V) tensors. Only real completion
  positions are computed (padding is skipped). Models whose logits are not a plain ``lm_head``
  of the last hidden state (final-logit soft-capping, logit scaling) fall back to one full pass.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Protocol, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from rredcot_cli.policy.kvcache import cache_kwarg

# Config attributes of architectures whose logits are more than lm_head(hidden): soft-capping
# (Gemma 2/3), a logit scale (Cohere) or divisor (Granite). These take the unchunked path.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def pack_prompt_completion(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Pack rows as ``[left pad | prompt | completion | right pad]``.

    Returns ``input_ids`` (B, P+T) int64, ``attention_mask`` (B, P+T) int64,
    ``completion_mask`` (B, T) bool (True on real completion tokens) and ``P``.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    batch = len(prompt_ids)
    width_p = max((len(p) for p in prompt_ids), default=0)
    width_t = max((len(c) for c in completion_ids), default=0)
    input_ids = torch.full((batch, width_p + width_t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width_p + width_t), dtype=torch.long)
    completion_mask = torch.zeros((batch, width_t), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        start = width_p - len(p)
        input_ids[i, start:width_p] = torch.tensor(p, dtype=torch.long)
        input_ids[i, width_p : width_p + len(c)] = torch.tensor(c, dtype=torch.long)
        attention_mask[i, start : width_p + len(c)] = 1
        completion_mask[i, : len(c)] = True
    return input_ids, attention_mask, completion_mask, width_p


def nucleus_logits(logits: torch.Tensor, top_p: float, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` (N, V) with every token outside the top-p nucleus set to -inf.

    The nucleus is transformers' ``TopPLogitsWarper`` rule (vLLM's is the same): sort ascending,
    drop tokens whose cumulative probability is <= 1 - top_p, always keep the most likely token.
    ``keep`` (N,) token ids stay in the nucleus regardless (the sampled tokens). No gradient flows
    through the choice of the nucleus, only through the kept logits."""
    if top_p >= 1.0:
        return logits
    with torch.no_grad():
        sorted_logits, order = logits.sort(dim=-1)
        remove_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
        remove_sorted[:, -1] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        if keep is not None:
            remove.scatter_(-1, keep[:, None], False)
    return logits.masked_fill(remove, float("-inf"))


# Elements of one (rows, vocabulary) block of ``LogSoftmaxGather``'s backward: 2^20 floats (4 MiB),
# 21 rows at SmolLM2's 49k vocabulary; two such blocks are alive beside the log-softmax.
_BACKWARD_BLOCK_ELEMENTS = 1 << 20


class LogSoftmaxGather(torch.autograd.Function):
    """``log_softmax(logits)`` and its entries at ``targets``, whose backward holds one (N, V) tensor.

    Autograd's log_softmax + gather keep the log-softmax for backward and there allocate the
    gather's gradient (zeros with one entry per row) and the logits' gradient: three (N, V)
    float32 tensors at once, the peak of a long completion's update (192 MiB each for 1,024
    positions x 49k; docs/studies/real-model-speed.md, "Defaults (issue 42)"). Here backward
    builds the gather's gradient a block of rows at a time, runs torch's own log-softmax backward
    kernel on the block and writes the result over the block's log-softmax, which nothing else
    reads: the (N, V) tensor returned is the saved log-softmax, now the logits' gradient.

    The numbers are autograd's bit for bit, at any temperature and top_p (those stay ordinary
    autograd ops before this one): the same ops (``scatter_add_`` onto zeros as gather's backward,
    ``_log_softmax_backward_data`` as log_softmax's) on the same values, and the kernel treats
    every row alone. Repeating the kernel's arithmetic in Python (``g - exp(logp) * g``) would
    not be: on torch 2.13's AVX512 kernel its exp differs from ``torch.exp`` by one ulp on ~10% of
    the entries, and it fuses the multiply-subtract (an FMA), which torch has no op for.

    Returns the log-probs (N,) and the log-softmax (N, V) without gradient (for the entropy). A
    second backward through the same graph (``retain_graph=True``) raises: the log-softmax is gone.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor):
        logp = torch.log_softmax(logits, dim=-1)
        ctx.save_for_backward(logp, targets)
        ctx.mark_non_differentiable(logp)
        ctx.set_materialize_grads(False)  # no (N, V) zeros for the log-softmax output's gradient
        ctx.consumed = False
        return logp.gather(-1, targets[:, None]).squeeze(-1), logp

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor | None, _grad_logp: None):
        if ctx.consumed:
            raise RuntimeError("LogSoftmaxGather: a second backward through the same graph; its log-softmax "
                               "became the first backward's gradient (run the forward again instead of "
                               "retain_graph=True)")
        logp, targets = ctx.saved_tensors
        if grad_logprobs is None:
            return None, None
        ctx.consumed = True
        rows = max(1, _BACKWARD_BLOCK_ELEMENTS // max(1, logp.shape[-1]))
        for start in range(0, logp.shape[0], rows):
            block = logp[start : start + rows]
            grad_block = torch.zeros_like(block).scatter_add_(
                -1, targets[start : start + rows, None], grad_logprobs[start : start + rows, None])
            # the op autograd's formula for log_softmax calls (derivatives.yaml), with its arguments
            block.copy_(torch._log_softmax_backward_data(grad_block, block, -1, block.dtype))
        return logp, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` (N,) under the sampling distribution of ``logits`` (N, V).

    Returns float32 ``logprobs`` (N,) and, when asked, the entropies (N,) of the same distribution
    (no gradient: entropy is a diagnostic and a segmentation signal here, never a loss term)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logits = nucleus_logits(logits, top_p, keep=targets)
    logprobs, logp = LogSoftmaxGather.apply(logits, targets)
    entropies = None
    if with_entropy:
        with torch.no_grad():
            # entr(0) = 0 outside the nucleus; written over the probabilities, so that one (N, V)
            # tensor less is alive beside the logits and log-probs (the same values: an
            # elementwise op in place)
            probs = logp.exp()
            entropies = torch.special.entr(probs, out=probs).sum(-1)
    return logprobs, entropies


def splittable_head(model: torch.nn.Module):
    """``(decoder body, lm_head)`` when the model's logits are exactly ``lm_head(last hidden)``."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, name, None) for name in _LOGIT_POSTPROCESSING):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if not callable(get_decoder) or not callable(get_head):
        return None
    try:
        body, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    if body is None or head is None or body is model:
        return None
    return body, head


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    with_entropy: bool = True,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs of each completion token given its prompt, under
    ``softmax(logits / temperature)`` restricted to the top-p nucleus (defaults: the model's own
    distribution).

    Differentiable: call it under ``torch.no_grad()`` when no gradient is wanted. Every prompt
    must have at least one token. ``chunk_tokens > 0`` runs the LM head over that many completion
    positions at a time (see the module docstring); the result is the same up to float rounding.

    Returns ``logprobs`` (B, T) float32, ``mask`` (B, T) bool and ``entropies`` (B, T) float32
    (None unless ``with_entropy``), T = the longest completion; padding positions hold 0.
    """
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (the first completion token is predicted from it)")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature} (greedy has no distribution)")
    device = next(model.parameters()).device
    input_ids, attention_mask, mask, width_p = pack_prompt_completion(prompt_ids, completion_ids, pad_id)
    batch, width_t = mask.shape
    logprobs = torch.zeros((batch, width_t), dtype=torch.float32, device=device)
    entropies = torch.zeros((batch, width_t), dtype=torch.float32, device=device) if with_entropy else None
    mask = mask.to(device)
    if width_t == 0:
        return logprobs, mask, entropies
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    targets = input_ids[:, width_p:][mask]  # (N,) the real completion tokens, row-major
    split = splittable_head(model) if chunk_tokens > 0 else None
    if split is None:
        # Logits at columns P-1 .. P+T-1; the one at P+T-1 predicts past the end and is dropped.
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       logits_to_keep=width_t + 1, use_cache=False).logits[:, :-1, :]
        flat_lp, flat_ent = token_logprobs(logits[mask], targets, temperature=temperature, top_p=top_p,
                                           with_entropy=with_entropy)
    else:
        body, head = split
        hidden = body(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                      position_ids=position_ids[:, :-1], use_cache=False).last_hidden_state
        hidden = hidden[:, width_p - 1 :][mask]  # (N, H): the states that predict completion tokens
        flat_lp, flat_ent = _chunked_head_logprobs(head, hidden, targets, temperature, top_p, with_entropy,
                                                   chunk_tokens)
    logprobs = logprobs.masked_scatter(mask, flat_lp)
    if with_entropy:
        entropies = entropies.masked_scatter(mask, flat_ent)
    return logprobs, mask, entropies


def _chunked_head_logprobs(head, hidden, targets, temperature, top_p, with_entropy, chunk_tokens):
    """``token_logprobs(head(hidden))`` ``chunk_tokens`` rows at a time; (N,) log-probs and
    entropies (or None). Under autograd each chunk is checkpointed: only its hidden states are
    kept for backward, its logits are recomputed there."""
    def one_chunk(h: torch.Tensor, t: torch.Tensor):
        return token_logprobs(head(h), t, temperature=temperature, top_p=top_p, with_entropy=with_entropy)

    grad = torch.is_grad_enabled() and hidden.requires_grad
    lps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        lp, ent = checkpoint(one_chunk, h, t, use_reentrant=False) if grad else one_chunk(h, t)
        lps.append(lp)
        ents.append(ent)
    flat_lp = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
    flat_ent = (torch.cat(ents) if ents else hidden.new_zeros(0, dtype=torch.float32)) if with_entropy else None
    return flat_lp, flat_ent


# Rows of logits per LM-head call in ``scored_positions_forward`` and ``head_chunk_rows``: 2^26
# floats (256 MiB) whatever the vocabulary (all positions at once for the embedded models, 1,365 at
# SmolLM2's 49k, ~440 at a 152k vocabulary).
_HEAD_CHUNK_ELEMENTS = 1 << 26


def head_chunk_rows(model: torch.nn.Module) -> int:
    """``chunk_tokens`` for ``completion_logprobs`` that keeps each LM-head call's logits at
    ``_HEAD_CHUNK_ELEMENTS`` floats, as ``scored_positions_forward`` does: for no-grad passes that
    want every completion position (entropies, scoring), where ``(rows, positions, vocabulary)``
    logits and their log-softmax would otherwise be GBs. A model whose logits are not a plain LM
    head (``splittable_head``) takes one full pass whatever this is."""
    split = splittable_head(model)
    return _head_rows(split[1]) if split is not None else 1


def _head_rows(head: torch.nn.Module) -> int:
    return max(1, _HEAD_CHUNK_ELEMENTS // head.weight.shape[0])  # rows of (rows, vocabulary) logits


def scored_positions_forward(model: torch.nn.Module, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor,
                             cache=None, **inputs):
    """One no-grad forward ``model(**inputs)`` that scores only the positions it is asked for.

    ``rows``, ``cols`` (N,) index the (batch, sequence) positions whose next-token log-prob is
    wanted, ``targets`` (N,) the tokens to score there. Returns the model's output (for its cache)
    and the float32 log-probs (N,) under ``softmax(logits)``. When the logits are a plain LM head
    of the last hidden state (``splittable_head``), the head and softmax run over those N
    positions only, a chunk of rows at a time: with a 152k vocabulary, full ``(B, T, V)`` logits of
    a probe batch would be tens of GB (and the head a third of a 0.5B model's work), while the
    scorers need a few positions per probe. Other models take one full pass, indexed after.
    ``cache`` (a transformers cache) is passed under the keyword the called module takes."""
    split = splittable_head(model)
    if split is None:
        out = model(**inputs, **(cache_kwarg(model, cache) if cache is not None else {}))
        return out, token_logprobs(out.logits[rows, cols], targets)[0]
    body, head = split
    out = body(**inputs, **(cache_kwarg(body, cache) if cache is not None else {}))
    hidden = out.last_hidden_state[rows, cols]  # (N, H)
    chunk = _head_rows(head)
    pieces = [token_logprobs(head(hidden[start : start + chunk]), targets[start : start + chunk])[0]
              for start in range(0, hidden.shape[0], chunk)]
    return out, torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)


# ----------------------------------------------------------------- scoring a batch of completions

class CompletionLogprobs(torch.nn.Module):
    """``completion_logprobs`` of ``module`` as a module's forward: the root that DDP and FSDP2 wrap
    (``train/distributed.py``), so their forward and backward hooks surround the whole pass even
    when the LM head runs in chunks outside the HF model's own forward. The child is called
    ``module`` so ``weights.unwrap`` sees through it."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, prompt_ids, completion_ids, pad_id, with_entropy, **kwargs):
        return completion_logprobs(self.module, prompt_ids, completion_ids, pad_id, with_entropy, **kwargs)


def is_logprob_root(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a ``CompletionLogprobs``, FSDP2-sharded or inside DDP."""
    return isinstance(model, CompletionLogprobs) or isinstance(getattr(model, "module", None), CompletionLogprobs)


@dataclass(frozen=True)
class ForwardPass:
    """How the trained model is run over completions.

    ``temperature``/``top_p``: the sampling distribution, so log-probs (old, new, reference) are
    those of the distribution the completions were drawn from. ``chunk_tokens``: LM-head chunk
    (``completion_logprobs``; 0 = one pass). ``micro_batch_size``: rows per forward and
    backward, gradients accumulated over a minibatch (0 = the whole minibatch at once).
    ``micro_batch_tokens``: also at most this many padded positions per forward (0 = no limit);
    with it, rows are sorted by length before they are cut into micro-batches (``micro_batches``),
    so each pass pads to rows of similar length. ``autocast``: the precision context
    (``train.precision.Precision.autocast``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    chunk_tokens: int = 0
    micro_batch_size: int = 0
    micro_batch_tokens: int = 0
    autocast: Callable[[], ContextManager] = field(default=nullcontext)

    def logprobs(self, model, prompt_ids, completion_ids, pad_id, with_entropy: bool):
        """(B, T) log-probs, mask and entropies (or None), T = longest completion, on the model's
        device. ``model`` is an HF model or a data-parallel ``CompletionLogprobs`` root, which is
        called so that its hooks run."""
        score = model if is_logprob_root(model) else functools.partial(completion_logprobs, model)
        with self.autocast():
            return score(prompt_ids, completion_ids, pad_id, with_entropy,
                         temperature=self.temperature, top_p=self.top_p, chunk_tokens=self.chunk_tokens)

    def rows_per_pass(self, minibatch_size: int) -> int:
        return self.micro_batch_size if 0 < self.micro_batch_size < minibatch_size else minibatch_size


def micro_batches(rows: list[int], prompt_ids: list[list[int]], completion_ids: list[list[int]], max_rows: int,
                  max_tokens: int = 0) -> list[list[int]]:
    """``rows`` cut into micro-batches of at most ``max_rows`` rows; gradients accumulated over
    them sum to those of one pass over ``rows``. Without ``max_tokens``, consecutive runs of
    ``rows`` in their order. With ``max_tokens`` > 0, ``rows`` sorted by length (prompt +
    completion) and cut so that no micro-batch exceeds that many padded positions (rows x (longest
    prompt + longest completion); a longer single row is a micro-batch alone): rows of similar
    length share a forward, so little of it is padding."""
    if max_tokens <= 0:
        step = max(1, max_rows)
        return [list(rows[k : k + step]) for k in range(0, len(rows), step)]
    order = sorted(rows, key=lambda i: (len(prompt_ids[i]) + len(completion_ids[i]), i))
    out: list[list[int]] = []
    width_p = width_c = 0
    for i in order:
        p, c = max(width_p, len(prompt_ids[i])), max(width_c, len(completion_ids[i]))
        if out and len(out[-1]) < max(1, max_rows) and len(out[-1]) * (p + c) + p + c <= max_tokens:
            out[-1].append(i)
            width_p, width_c = p, c
        else:
            out.append([i])
            width_p, width_c = len(prompt_ids[i]), len(completion_ids[i])
    return out


class RowSharing(Protocol):
    """What a scoring pass needs of a data-parallel group: this rank's contiguous ``share`` of the
    rows, its ``micro_passes`` (padded with empty ones so every rank makes as many) and the ranks'
    results stacked (``concat_rows``). ``train.distributed.DataParallel`` is one; ``OneProcess``
    is the group of one."""

    def share(self, items: Sequence) -> list: ...

    def micro_passes(self, rows: Sequence[int], cut: Callable[[list[int]], list[list[int]]]) -> list[list[int]]: ...

    def concat_rows(self, part: torch.Tensor, width: int, fill: float = 0.0) -> torch.Tensor: ...


class OneProcess:
    """The ``RowSharing`` of a single process: every row is its own, nothing to gather."""

    def share(self, items: Sequence) -> list:
        return list(items)

    def micro_passes(self, rows: Sequence[int], cut: Callable[[list[int]], list[list[int]]]) -> list[list[int]]:
        return cut(list(rows))

    def concat_rows(self, part: torch.Tensor, width: int, fill: float = 0.0) -> torch.Tensor:
        return part


@torch.no_grad()
def chunked_completion_logprobs(model, prompt_ids, completion_ids, pad_id, chunk_size,
                                forward: ForwardPass = ForwardPass(), parallel: RowSharing = OneProcess()):
    """``forward.logprobs`` of every row without gradients, ``chunk_size`` sequences at a time
    (``micro_batches``, with ``forward.micro_batch_tokens``) so a large batch does not hold every
    sequence's activations at once. (B, T) CPU float32 log-probs, bool mask and entropies.

    With a data-parallel ``parallel`` (``RowSharing``) each rank scores its share of the rows,
    making as many passes as every other rank (sharded weights need all ranks in every pass), and
    the results are all-gathered."""
    T = max((len(c) for c in completion_ids), default=0)
    everything = range(len(completion_ids))
    share = parallel.share(everything)
    first = share[0] if share else 0  # this rank's rows are first, first + 1, ...
    logprobs = torch.zeros(len(share), T)
    mask = torch.zeros(len(share), T, dtype=torch.bool)
    entropies = torch.zeros(len(share), T)
    passes = parallel.micro_passes(everything, lambda rows: micro_batches(rows, prompt_ids, completion_ids, chunk_size,
                                                                        forward.micro_batch_tokens))
    for chunk in passes:
        picked = chunk or [0]  # a rank out of rows still takes part in the pass
        lp, m, ent = forward.logprobs(model, [prompt_ids[i] for i in picked], [completion_ids[i] for i in picked],
                                      pad_id, True)
        if not chunk:
            continue
        t, at = lp.shape[1], torch.tensor(chunk) - first  # positions in this rank's share
        logprobs[at, :t] = lp.float().cpu()
        mask[at, :t] = m.cpu()
        entropies[at, :t] = ent.float().cpu()
    return parallel.concat_rows(logprobs, T), parallel.concat_rows(mask, T, False), parallel.concat_rows(entropies, T)
