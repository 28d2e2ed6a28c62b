"""Supervised fine-tuning of the tiny model from scratch on gold synthetic chains.

Each example is ``prompt + solution + EOS`` (character tokens); the loss is the mean next-token
cross-entropy over the completion tokens (solution and EOS) only. AdamW, linear warm-up then
cosine decay to 10% of ``lr``, gradient-norm clipping. The result is a plain HF folder
(``model.safetensors``, ``config.json``, ``generation_config.json``, tokenizer files).
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from transformers import AutoModelForCausalLM

from rredcot_cli.console import progress_bar
from rredcot_cli.rng import seed_everything
from rredcot_cli.policy.model_files import save_tokenizer
from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model, count_parameters

if TYPE_CHECKING:
    from rredcot_cli.config.schema import SFTConfig


def _lr_factor(step: int, total: int, warmup: int, final_ratio: float = 0.1) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _encode_examples(
    benchmark, problems, tokenizer, error_rate: float = 0.0, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) per problem; fails on characters the tokenizer lacks."""
    examples = []
    rng = random.Random(seed)
    for problem in problems:
        prompt = tokenizer.encode(benchmark.prompt(problem), add_special_tokens=False)
        solution = benchmark.solution(problem, error_rate=error_rate, rng=rng) if error_rate > 0 else benchmark.solution(problem)
        completion = tokenizer.encode(solution, add_special_tokens=False)
        if tokenizer.unk_token_id in prompt or tokenizer.unk_token_id in completion:
            raise ValueError(f"{problem.prompt_id}: text has characters outside the tokenizer alphabet")
        examples.append((prompt, completion + [tokenizer.eos_token_id]))
    return examples


def _mixed_examples(primary: list, rehearsal: list, seed: int) -> list:
    """``primary`` and ``rehearsal`` examples shuffled together (seeded). Only called with a
    rehearsal set, so an unmixed run trains on the order it always did."""
    examples = primary + rehearsal
    random.Random(seed).shuffle(examples)
    return examples


def _grouped_by_length(examples: list, batch_size: int, seed: int, window_batches: int = 32) -> list:
    """The same examples reordered so that each batch holds similar lengths: within windows of
    ``window_batches`` batches the examples are sorted by length and cut into batches, whose order
    is then shuffled (seeded), so training does not see short-to-long order inside a window."""
    rng = random.Random(seed)
    window = batch_size * window_batches
    ordered = []
    for start in range(0, len(examples), window):
        chunk = sorted(examples[start : start + window], key=lambda e: len(e[0]) + len(e[1]))
        batches = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        ordered.extend(e for b in batches for e in b)
    return ordered


def _collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``input_ids`` (B, L), ``attention_mask`` (B, L) and ``loss_mask`` (B, L-1).

    ``loss_mask[i, t]`` is True when token t+1 of row i is a completion token, i.e. when the
    prediction made at position t is trained.
    """
    length = max(len(p) + len(c) for p, c in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), length - 1), dtype=torch.bool)
    for i, (p, c) in enumerate(examples):
        seq = p + c
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
        loss_mask[i, len(p) - 1 : len(seq) - 1] = True
    return input_ids, attention_mask, loss_mask


def train_sft(
    settings: SFTConfig,
    *,
    benchmark,
    output_dir: str | Path,
    seed: int,
    init: str | Path | None = None,
    mix_benchmark=None,
    eval_fn: Callable[[torch.nn.Module, object, int], dict] | None = None,
    eval_every: int = 0,
    progress: bool = True,
) -> dict:
    """Train a fresh tiny model on ``benchmark``'s gold solutions with the typed ``sft.*``
    ``settings`` and save it to ``output_dir``; with ``init`` (a model folder with the same
    character tokenizer, e.g. the shipped tiny-chain, which the stage resolves from
    ``settings.init``) continue training that model instead (the architecture settings are then
    unused).

    ``benchmark`` needs ``load``, ``prompt`` and ``solution``; ``steps * batch_size`` problems of
    its "train" split are used once each, in order. ``eval_fn(model, tokenizer, step) -> dict`` is
    called (model in eval mode, no grad) every ``eval_every`` steps if > 0 and after the last
    step; its numbers are merged into the returned metrics and the history.

    With ``mix_benchmark`` (same interface; the stage builds it from ``settings.mix_benchmark``),
    ``settings.mix_fraction`` of the ``steps * batch_size`` examples are its train problems
    instead, shuffled in with the rest (rehearsal of a format the model should keep).
    ``settings.group_by_length`` batches similar lengths together (less padding).

    Returns ``{"loss", "steps", "seconds", "num_parameters", "history", **final eval}``, where
    ``loss`` is the mean completion loss of the last 20 steps and ``history`` a list of dicts.
    """
    seed_everything(seed)
    output_dir = Path(output_dir)
    f = settings
    steps, batch_size = f.steps, f.batch_size

    tokenizer = build_char_tokenizer(model_max_length=f.max_position_embeddings)
    model = _initial_model(init, tokenizer) if init else build_tiny_model(
        len(tokenizer),
        hidden_size=f.hidden_size,
        num_layers=f.num_layers,
        num_heads=f.num_heads,
        intermediate_size=f.intermediate_size,
        max_position_embeddings=f.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.train()
    total = steps * batch_size
    rehearsed = round(total * f.mix_fraction) if mix_benchmark is not None else 0
    problems = benchmark.load("train", limit=total - rehearsed)
    examples = _encode_examples(benchmark, problems, tokenizer, f.solution_error_rate, seed)
    if rehearsed:
        rehearsal = _encode_examples(mix_benchmark, mix_benchmark.load("train", limit=rehearsed), tokenizer,
                                     f.solution_error_rate, seed + 1)
        examples = _mixed_examples(examples, rehearsal, seed)
    if f.group_by_length:
        examples = _grouped_by_length(examples, batch_size, seed)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": f.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=f.lr,
        betas=(0.9, 0.99),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps, f.warmup_steps))

    def run_eval(step: int) -> dict:
        model.eval()
        with torch.no_grad():
            result = dict(eval_fn(model, tokenizer, step))
        model.train()
        return result

    history: list[dict] = []
    recent: list[float] = []
    final_eval: dict = {}
    started = time.perf_counter()
    with progress_bar("sft", total=steps, unit="step") if progress else nullcontext(_no_progress) as advance:
        for step in range(steps):
            batch = examples[step * batch_size : (step + 1) * batch_size]
            input_ids, attention_mask, loss_mask = _collate(batch, tokenizer.pad_token_id)
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, L-1, V)
            nll = -logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
            loss = (nll * loss_mask).sum() / loss_mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), f.grad_clip)
            optimizer.step()
            scheduler.step()

            recent = (recent + [loss.item()])[-20:]
            record = {"step": step + 1, "loss": loss.item(), "grad_norm": grad_norm.item(),
                      "tokens": int(attention_mask.sum()), "padded_tokens": int(attention_mask.numel()),
                      "lr": optimizer.param_groups[0]["lr"], "seconds": time.perf_counter() - started}
            evaluated = eval_fn is not None and ((eval_every > 0 and (step + 1) % eval_every == 0) or step + 1 == steps)
            if evaluated:
                final_eval = run_eval(step + 1)
                record.update(final_eval)
            if (step + 1) % 10 == 0 or step + 1 == steps or evaluated:
                history.append(record)
            info = f"loss {sum(recent) / len(recent):.4f}  lr {record['lr']:.2e}"
            advance(1, info=info + _eval_info(final_eval) if evaluated else info)

    seconds = time.perf_counter() - started
    output_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(str(output_dir))  # safetensors
    save_tokenizer(tokenizer, output_dir)
    return {
        "loss": sum(recent) / max(1, len(recent)),
        "steps": steps,
        "seconds": seconds,
        "num_parameters": count_parameters(model),
        "history": history,
        **final_eval,
    }


def _eval_info(scores: dict) -> str:
    """An eval's numbers for the progress line, e.g. ``  eval pass@1 0.812``."""
    numbers = [f"{key} {value:.3f}" for key, value in scores.items() if isinstance(value, (int, float))]
    return "  eval " + "  ".join(numbers) if numbers else ""


def _no_progress(k: int = 1, info: str | None = None) -> None:
    """``advance`` when ``train_sft(progress=False)``: nothing shown."""


def _initial_model(path: str | Path, tokenizer) -> torch.nn.Module:
    """The float32 model in ``path`` to continue from; ValueError unless it uses ``tokenizer``'s vocabulary."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if model.config.vocab_size != len(tokenizer):
        raise ValueError(f"sft.init={path}: its vocabulary has {model.config.vocab_size} tokens, the character "
                         f"tokenizer {len(tokenizer)}; sft.init needs a model trained by rredcot sft")
    return model
