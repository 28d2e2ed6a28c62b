"""The transformers backend: batched ``model.generate`` with per-token log-probs, and
teacher-forced scoring (``rredcot_cli.policy.logprobs``, which also documents the sequence layout).
Runs on CPU (the embedded model) or on one GPU.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from rredcot_cli.policy.base import Completion, SamplingParams
from rredcot_cli.policy import row_stream, shared_prompt
from rredcot_cli.policy.kvcache import cache_kwarg, growing_cache
from rredcot_cli.policy.logprobs import completion_logprobs, head_chunk_rows
from rredcot_cli.policy.continuations import sample_continuations


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


# Generation-config fields that make transformers add a logits processor or stopping rule of its
# own; a model that sets any of them decodes with ``generate`` itself.
_EXTRA_PROCESSING = ("min_length", "min_new_tokens", "suppress_tokens", "begin_suppress_tokens",
                     "forced_bos_token_id", "forced_eos_token_id", "bad_words_ids", "sequence_bias",
                     "exponential_decay_length_penalty", "renormalize_logits", "stop_strings", "max_time",
                     "encoder_repetition_penalty", "encoder_no_repeat_ngram_size", "guidance_scale",
                     "watermarking_config", "forced_decoder_ids")


def _plain_generation_config(model) -> bool:
    """Whether ``generate`` with this backend's settings would only apply temperature and top-p."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return False
    return not any(getattr(config, name, None) not in (None, 0, False, 1.0, [], ()) for name in _EXTRA_PROCESSING)


class HFBackend:
    """Backend on a transformers causal LM (see ``rredcot_cli/policy/base.py`` for the contract).

    ``model`` must already sit on ``device``. ``batch_size`` is the number of sequences
    (prompts x samples) per ``generate`` call and per scoring forward pass.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, device: str | torch.device = "cpu",
                 growing_cache: bool = True, compact: bool = True, share_prompts: bool = True,
                 kv_dtype: torch.dtype | None = None):
        self.model = model
        self.growing_cache = growing_cache  # kvcache.growing_cache; False: transformers' default cache
        # Decode with _compacting_decode (finished rows leave the batch) where the model's
        # generation config adds no logits processor of its own; False: transformers' generate.
        self.compact = compact
        # In _compacting_decode, rows with the same prompt share its keys and values
        # (shared_prompt.py: one prefill and one read per prompt) where the model supports it.
        self.share_prompts = share_prompts
        # Keys, values and decode attention in this dtype (None: the model's); needs the decode
        # above, hence a model with full-attention layers only.
        self.kv_dtype = kv_dtype
        if kv_dtype is not None and not shared_prompt.supported(model):
            raise ValueError(f"kv_dtype={kv_dtype}: this model has layers other than full attention; "
                             "decode it in its own dtype")
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
        # kvcache.growing_cache: no copy of the whole cache per decoded token (same numbers)
        cache = growing_cache(self.model, width + params.max_new_tokens) if self.growing_cache else None
        if self.compact and cache is not None and _plain_generation_config(self.model):
            every_row = list(range(len(prompt_ids)))
            row_group, firsts = shared_prompt.prompt_groups(prompt_ids) if self.share_prompts else (every_row, every_row)
            share = (len(firsts) < len(prompt_ids) or self.kv_dtype is not None) and shared_prompt.supported(self.model)
            rows = self._compacting_decode(input_ids, attention_mask, params, cache,
                                           (torch.tensor(row_group, device=self.device), firsts) if share else None)
            return [self._completion(ids, lps) for ids, lps in rows]
        recorder = _SampledLogprobRecorder(params.temperature, params.top_p, sampling=params.temperature > 0)
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_processor=LogitsProcessorList([recorder]),
            **self._generate_kwargs(params),
            **(cache_kwarg(self.model, cache) if cache is not None else {}),
        )
        new_tokens = sequences[:, input_ids.shape[1] :].cpu()  # (b, steps)
        logprobs = recorder.finish(sequences[:, -1]).cpu() if new_tokens.shape[1] else torch.zeros_like(new_tokens, dtype=torch.float32)
        return [self._completion(row, row_lp) for row, row_lp in zip(new_tokens.tolist(), logprobs.tolist())]

    def _completion(self, row: list[int], row_lp: list[float]) -> Completion:
        """The completion of one generated row: cut after its first EOS ("stop"), else "length"."""
        eos = set(self.eos_ids)
        stop = next((j for j, t in enumerate(row) if t in eos), None)
        if stop is None:
            ids, lps, reason = row, row_lp, "length"
        else:
            ids, lps, reason = row[: stop + 1], row_lp[: stop + 1], "stop"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(token_ids=ids, logprobs=lps, text=text, finish_reason=reason)

    def _compacting_decode(self, input_ids, attention_mask, params: SamplingParams, cache,
                           groups: tuple[torch.Tensor, list[int]] | None = None) -> list[tuple[list, list]]:
        """transformers' sampling loop (``GenerationMixin._sample`` with this backend's settings:
        temperature and top-p warpers, EOS or ``max_new_tokens`` ends a row) in which rows that
        finished leave the batch, a quarter of it at a time: ``generate`` runs every row until the
        longest is done, and at the default length a third of its row-steps are finished rows (half
        of them at ~500-token completions with a long tail). The random stream is transformers':
        every step draws one multinomial sample per original row (a finished row's from a point
        mass), so a call gives the tokens ``generate`` gives, up to the float rounding of smaller
        batches. On CPU only the live rows' random numbers are made (``row_stream.py``: the stream
        is moved past the others' at a fifth of the cost; the same tokens bit for bit). ``cache``:
        an empty ``kvcache.growing_cache``. ``groups``: (group of each row, first row of each
        group) for rows that share prompts: each prompt is prefilled once and
        the decode steps read its keys and values once per step (``shared_prompt.py``; same
        numbers up to rounding). Returns per row the generated tokens (EOS included) and their
        log-probs."""
        model, sampling = self.model, params.temperature > 0
        last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        B, width = input_ids.shape
        warpers = LogitsProcessorList(
            ([TemperatureLogitsWarper(params.temperature)] if sampling and params.temperature != 1.0 else [])
            + ([TopPLogitsWarper(top_p=params.top_p)] if sampling and params.top_p < 1.0 else []))
        eos = torch.tensor(self.eos_ids, device=self.device)
        rows = torch.arange(B, device=self.device)  # original row of each batch position
        live = torch.ones(B, dtype=torch.bool, device=self.device)  # not finished, per batch position
        mask = attention_mask
        step_ids = input_ids
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        if groups is None:
            logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                           **last_only, **cache_kwarg(model, cache)).logits[:, -1].float()
            decoding, shared = nullcontext(), {}
        else:
            row_group, firsts = groups
            distinct = torch.tensor(firsts, device=self.device)
            logits = model(input_ids=input_ids[distinct], attention_mask=mask[distinct],
                           position_ids=positions[distinct], use_cache=True, **last_only,
                           **cache_kwarg(model, cache)).logits[:, -1].float()[row_group]
            cache = shared_prompt.shared_prompt_cache(cache, mask[distinct], row_group, params.max_new_tokens,
                                                      self.kv_dtype)
            decoding, shared = shared_prompt.decode_attention(model), {"shared_prompt": cache}
        # row_stream: the draws of multinomial over all B rows, made for the live ones only
        stream = row_stream.RowStream(B, logits.shape[-1]) if sampling and row_stream.supported(self.device) else None
        steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, tokens, log-probs)
        with decoding:
            for step in range(params.max_new_tokens):
                scores = warpers(step_ids, logits)
                if sampling and stream is not None:  # draws for live rows only, in their places of the stream
                    chosen = torch.full_like(rows, self.pad_id)
                    chosen[live] = stream.sample(torch.softmax(scores[live], dim=-1), rows[live].tolist())
                elif sampling:
                    probs = torch.zeros((B, scores.shape[-1]), device=scores.device)
                    probs[:, self.pad_id] = 1.0  # rows that left the batch: a point mass, one draw each
                    probs[rows] = torch.softmax(scores, dim=-1)
                    chosen = torch.multinomial(probs, num_samples=1).squeeze(1)[rows]
                else:
                    chosen = scores.argmax(dim=-1)
                chosen = torch.where(live, chosen, torch.full_like(chosen, self.pad_id))
                logprobs = torch.log_softmax(scores, dim=-1).gather(1, chosen[:, None]).squeeze(1)
                steps.append((rows[live].cpu(), chosen[live].cpu(), logprobs[live].float().cpu()))
                live = live & ~torch.isin(chosen, eos)
                if not live.any() or step == params.max_new_tokens - 1:
                    break
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
                step_ids, positions = chosen[:, None], positions[:, -1:] + 1
                if (~live).sum() * 4 >= live.numel():  # a quarter of the batch finished: drop it
                    keep = live.nonzero().squeeze(1)
                    cache.batch_select_indices(keep)
                    mask, step_ids, positions, rows, live = mask[keep], step_ids[keep], positions[keep], rows[keep], live[keep]
                logits = model(input_ids=step_ids, attention_mask=None if shared else mask, position_ids=positions,
                               use_cache=True, **last_only, **cache_kwarg(model, cache), **shared).logits[:, -1].float()
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        for step_rows, step_tokens, step_lps in steps:
            for r, tok, lp in zip(step_rows.tolist(), step_tokens.tolist(), step_lps.tolist()):
                tokens[r].append(tok)
                logps[r].append(lp)
        return list(zip(tokens, logps))

    # -- score ---------------------------------------------------------------------------
    def score(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        with_entropy: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Teacher-forced log-probs at temperature 1, in batches of ``batch_size`` rows; the LM head
        runs over the completion positions, ``logprobs.head_chunk_rows`` at a time.

        Returns a list of (len(completion_ids[i]),) float32 CPU tensors, and the entropies of the
        next-token distributions at the same positions when ``with_entropy`` (else None).
        """
        all_lp: list[torch.Tensor] = []
        all_ent: list[torch.Tensor] = []
        with torch.no_grad():
            for start in range(0, len(prompt_ids), self.batch_size):
                p_chunk = prompt_ids[start : start + self.batch_size]
                c_chunk = completion_ids[start : start + self.batch_size]
                lp, _, ent = completion_logprobs(self.model, p_chunk, c_chunk, self.pad_id, with_entropy,
                                                 chunk_tokens=head_chunk_rows(self.model))
                lp = lp.cpu()
                ent = ent.cpu() if ent is not None else None
                for i, c in enumerate(c_chunk):
                    all_lp.append(lp[i, : len(c)].clone())
                    if ent is not None:
                        all_ent.append(ent[i, : len(c)].clone())
        return all_lp, (all_ent if with_entropy else None)

    # -- continuations (Monte Carlo values, the judge's reference) -----------------------
    def continuations(self, prefixes: list[list[int]], *, k: int, max_new_tokens: int | list[int],
                      temperature: float, top_p: float, seed: int, rows_per_forward: int = 64,
                      stats: dict | None = None) -> list[list[list[int]]]:
        """``k`` continuations of every prefix (rredcot_cli/policy/continuations.py: each prefix's KV cache
        shared by its k rows, randomness seeded by the prefix's tokens), ``rows_per_forward`` rows
        decoded together."""
        return sample_continuations(self.model, prefixes, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                                    top_p=top_p, eos_ids=self.eos_ids, pad_id=self.pad_id, seed=seed,
                                    device=str(self.device), rows_per_forward=rows_per_forward, stats=stats)

    def sleep(self) -> None:
        """Nothing to free: generation holds no memory between calls (the KV cache is per call)."""

    def sync_weights(self, model) -> None:
        """In-process: generation simply uses ``model`` from now on."""
        self.model = model
