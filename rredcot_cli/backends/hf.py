"""The transformers backend: batched ``model.generate`` with per-token log-probs, and
teacher-forced scoring. Runs on CPU (the embedded model) or on one GPU.

Sequence layout used for scoring and for the policy gradient (one row per completion)::

    [pad ... pad | prompt tokens | completion tokens | pad ... pad]
     <-- left padded to P -------> <-- right padded to T -------->

so every completion starts at column P and its log-probs are a plain slice of the logits.
Position ids count real tokens only (``cumsum(attention_mask) - 1``), so a row gives the same
log-probs whatever it is batched with.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from rredcot_cli.backends.base import Completion, SamplingParams


# ------------------------------------------------------------------------------------------
# Teacher forcing
# ------------------------------------------------------------------------------------------


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


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs (temperature 1) of each completion token given its prompt.

    Differentiable: call it under ``torch.no_grad()`` when no gradient is wanted. Every prompt
    must have at least one token.

    Returns ``logprobs`` (B, T) float32, ``mask`` (B, T) bool and ``entropies`` (B, T) float32
    (entropy of the full next-token distribution; None unless ``with_entropy``), where
    T = the longest completion; padding positions hold 0.
    """
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (the first completion token is predicted from it)")
    device = next(model.parameters()).device
    input_ids, attention_mask, mask, width_p = pack_prompt_completion(prompt_ids, completion_ids, pad_id)
    batch, width_t = mask.shape
    if width_t == 0:
        empty = torch.zeros((batch, 0), dtype=torch.float32, device=device)
        return empty, mask.to(device), (empty.clone() if with_entropy else None)
    input_ids, attention_mask, mask = input_ids.to(device), attention_mask.to(device), mask.to(device)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    # Logits at columns P-1 .. P+T-1; the one at P+T-1 predicts past the end and is dropped.
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=width_t + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float()  # (B, T, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, width_p:]  # (B, T)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
    entropies = None
    if with_entropy:
        entropies = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logprobs, mask, entropies


# ------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------


class _SampledLogprobRecorder(LogitsProcessor):
    """Records log pi_sampling(token) of every generated token without keeping all the scores.

    ``generate`` runs custom processors before its own temperature/top-p warpers, so this one
    applies the same warpers itself to rebuild the sampling distribution. At step t it sees the
    token chosen at step t-1 as ``input_ids[:, -1]`` and reads its log-prob from the stored
    distribution; ``finish`` handles the last step. Memory: one (B, V) tensor.
    """

    def __init__(self, temperature: float, top_p: float, sampling: bool):
        warpers = []
        if sampling and temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if sampling and top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.prev_logp: torch.Tensor | None = None  # (B, V)
        self.chosen: list[torch.Tensor] = []  # per step, (B,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev_logp is not None:
            self.chosen.append(self.prev_logp.gather(1, input_ids[:, -1:]).squeeze(1))
        warped = self.warpers(input_ids, scores.float())
        self.prev_logp = torch.log_softmax(warped, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(B, steps) float32 log-probs of the generated tokens."""
        if self.prev_logp is not None:
            self.chosen.append(self.prev_logp.gather(1, last_tokens[:, None]).squeeze(1))
        if not self.chosen:
            return torch.zeros((last_tokens.shape[0], 0))
        return torch.stack(self.chosen, dim=1).float()


class HFBackend:
    """Backend on a transformers causal LM (see ``backends/base.py`` for the contract).

    ``model`` must already sit on ``device``. ``batch_size`` is the number of sequences
    (prompts x samples) per ``generate`` call and per scoring forward pass.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, device: str | torch.device = "cpu"):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = torch.device(device)
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token (load_model_and_tokenizer sets one)")
        self.pad_id = tokenizer.pad_token_id
        eos = getattr(model.generation_config, "eos_token_id", None)
        self.eos_ids: list[int] = (
            [tokenizer.eos_token_id] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
        )

    # -- generate ------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> list[list[Completion]]:
        """``params.n`` completions per prompt; same (prompt_ids, params, seed, batch_size) -> same output.

        temperature 0 means greedy; the log-probs are then those of the model at temperature 1.
        Otherwise each log-prob is that of the token under the distribution it was sampled from
        (temperature and top-p applied). Prompts x n are generated in chunks of ``batch_size``.
        """
        flat = [list(p) for p in prompt_ids for _ in range(params.n)]
        flat_out: list[Completion] = []
        fork_devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(seed)
            for start in range(0, len(flat), self.batch_size):
                flat_out.extend(self._generate_batch(flat[start : start + self.batch_size], params))
        return [flat_out[i * params.n : (i + 1) * params.n] for i in range(len(prompt_ids))]

    def _generate_kwargs(self, params: SamplingParams) -> dict:
        sampling = params.temperature > 0
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            use_cache=True,
        )
        if sampling:
            # Spell out neutral values so a checkpoint's generation_config.json (e.g. top_k=20,
            # min_p) cannot add warpers that the recorded log-probs would not know about.
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0, min_p=0.0,
                          typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
        return kwargs

    def _generate_batch(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token to generate from")
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):  # left padding, as batched generation needs
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        recorder = _SampledLogprobRecorder(params.temperature, params.top_p, sampling=params.temperature > 0)
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_processor=LogitsProcessorList([recorder]),
            **self._generate_kwargs(params),
        )
        new_tokens = sequences[:, input_ids.shape[1] :].cpu()  # (b, steps)
        logprobs = recorder.finish(sequences[:, -1]).cpu() if new_tokens.shape[1] else torch.zeros_like(new_tokens, dtype=torch.float32)
        eos = set(self.eos_ids)
        out = []
        for row, row_lp in zip(new_tokens.tolist(), logprobs.tolist()):
            stop = next((j for j, t in enumerate(row) if t in eos), None)
            if stop is None:
                ids, lps, reason = row, row_lp, "length"
            else:
                ids, lps, reason = row[: stop + 1], row_lp[: stop + 1], "stop"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append(Completion(token_ids=ids, logprobs=lps, text=text, finish_reason=reason))
        return out

    # -- score ---------------------------------------------------------------------------
    def score(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        with_entropy: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Teacher-forced log-probs at temperature 1, in batches of ``batch_size`` rows.

        Returns a list of (len(completion_ids[i]),) float32 CPU tensors, and the entropies of the
        next-token distributions at the same positions when ``with_entropy`` (else None).
        """
        all_lp: list[torch.Tensor] = []
        all_ent: list[torch.Tensor] = []
        with torch.no_grad():
            for start in range(0, len(prompt_ids), self.batch_size):
                p_chunk = prompt_ids[start : start + self.batch_size]
                c_chunk = completion_ids[start : start + self.batch_size]
                lp, _, ent = completion_logprobs(self.model, p_chunk, c_chunk, self.pad_id, with_entropy)
                lp = lp.cpu()
                ent = ent.cpu() if ent is not None else None
                for i, c in enumerate(c_chunk):
                    all_lp.append(lp[i, : len(c)].clone())
                    if ent is not None:
                        all_ent.append(ent[i, : len(c)].clone())
        return all_lp, (all_ent if with_entropy else None)

    def sync_weights(self, model) -> None:
        """In-process: generation simply uses ``model`` from now on."""
        self.model = model
