"""Next-token entropies (segment=entropy/hybrid, rredcot train with them, HFBackend.score) run the LM
head, log-softmax and entropy over the real completion positions only, a chunk at a time: at
SmolLM2's 49k vocabulary, (rows, positions, vocabulary) logits of 32 completions of 200 tokens and
their log-softmax held 7.3 GB (issue 27). The numbers are those of a full-logits pass up to float32
rounding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rredcot_cli.policy.logprobs as logprobs_module
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.logprobs import completion_logprobs, head_chunk_rows
from rredcot_cli.policy.load import Policy, encode_prompt, format_prompt
from rredcot_cli.pipeline import completion_entropies

# Entropies are sums over 49k terms of about 10 nats on the random model: float32 rounding of the
# decoder pass (the chunked path runs it over one column fewer) is ~1e-5 nats.
ATOL = 5e-5
COMPLETION_LENGTHS = (200, 173, 1, 240, 90, 210, 199, 230, 185)  # 1,528 positions: two default chunks


@pytest.fixture(scope="module")
def tiny(tiny_bpe_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bpe_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_bpe_dir, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def samples(tiny):
    model, tokenizer = tiny
    questions = ["What is 2 + 3?", "Natalia sold 48 clips in April and half as many in May. How many in all?",
                 "A train goes 60 km in 1.5 hours. What is its speed?"]
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, n in enumerate(COMPLETION_LENGTHS):
        prompt = encode_prompt(tokenizer, format_prompt(tokenizer, questions[i % len(questions)], True), True)
        completion = torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()
        rows.append({"prompt_token_ids": prompt, "completion_token_ids": completion})
    return rows


class HeadRows:
    """Positions the LM head is called on, one entry per call."""

    def __init__(self, model):
        self.calls: list[int] = []
        self._hook = model.get_output_embeddings().register_forward_hook(
            lambda module, args, out: self.calls.append(args[0].shape[:-1].numel()))

    def remove(self):
        self._hook.remove()


def _policy(model, tokenizer) -> Policy:
    return Policy(model=model, tokenizer=tokenizer, backend=None, device="cpu", chat_template=True)


def _full_logit_entropies(model, samples) -> list[torch.Tensor]:
    """Each completion alone through the whole model: entropies of softmax(logits), in float64."""
    out = []
    with torch.no_grad():
        for s in samples:
            p, c = s["prompt_token_ids"], s["completion_token_ids"]
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].double()
            logp = torch.log_softmax(logits, -1)
            out.append(-(logp.exp() * logp).sum(-1))
    return out


def test_completion_entropies_run_the_lm_head_on_completion_positions_in_chunks(tiny, samples):
    """The old pass called the head once on every (row, column) of the padded batch (9 x 241 here);
    now it sees each real completion position once, at most head_chunk_rows at a time."""
    model, tokenizer = tiny
    chunk = head_chunk_rows(model)
    assert chunk == (1 << 26) // model.config.vocab_size == 1365
    positions = sum(COMPLETION_LENGTHS)
    head = HeadRows(model)
    try:
        entropies = completion_entropies(_policy(model, tokenizer), samples)
    finally:
        head.remove()
    assert sum(head.calls) == positions
    assert max(head.calls) <= chunk
    assert len(head.calls) == -(-positions // chunk)
    assert [len(e) for e in entropies] == list(COMPLETION_LENGTHS)


def test_completion_entropies_equal_full_logits_entropies(tiny, samples, monkeypatch):
    """Chunked entropies equal those of full logits (each row alone, float64 softmax) and of the
    unchunked batched pass, up to float32 rounding, whatever the chunk size."""
    model, tokenizer = tiny
    reference = _full_logit_entropies(model, samples)
    with torch.no_grad():
        _, _, unchunked = completion_logprobs(model, [s["prompt_token_ids"] for s in samples],
                                              [s["completion_token_ids"] for s in samples],
                                              tokenizer.pad_token_id, True)
    default = completion_entropies(_policy(model, tokenizer), samples)
    monkeypatch.setattr(logprobs_module, "_HEAD_CHUNK_ELEMENTS", 7 * model.config.vocab_size)  # 7 rows a call
    head = HeadRows(model)
    try:
        small = completion_entropies(_policy(model, tokenizer), samples)
    finally:
        head.remove()
    assert max(head.calls) <= 7 and sum(head.calls) == sum(COMPLETION_LENGTHS)
    for i, expected in enumerate(reference):
        n = len(expected)
        for got in (default[i], small[i]):
            got = torch.tensor(got, dtype=torch.float64)
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, atol=ATOL, rtol=0)
            assert torch.allclose(got, unchunked[i, :n].double(), atol=ATOL, rtol=0)


def test_completion_entropies_without_a_plain_head_take_one_full_pass(tiny, samples, monkeypatch):
    """Logits that are more than lm_head(hidden) (soft-capping) cannot be chunked: one full pass."""
    model, tokenizer = tiny
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    assert head_chunk_rows(model) == 1
    head = HeadRows(model)
    try:
        entropies = completion_entropies(_policy(model, tokenizer), samples[:2])
    finally:
        head.remove()
    assert len(head.calls) == 1 and head.calls[0] > sum(COMPLETION_LENGTHS[:2])
    for got, expected in zip(entropies, _full_logit_entropies(model, samples[:2])):  # Llama ignores it
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), expected, atol=ATOL, rtol=0)


def test_hf_score_runs_the_lm_head_in_chunks(tiny, samples, monkeypatch):
    """HFBackend.score (log-probs and entropies) chunks the head too, with the same numbers."""
    model, tokenizer = tiny
    prompts = [s["prompt_token_ids"] for s in samples]
    completions = [s["completion_token_ids"] for s in samples]
    monkeypatch.setattr(logprobs_module, "_HEAD_CHUNK_ELEMENTS", 64 * model.config.vocab_size)  # 64 rows a call
    head = HeadRows(model)
    try:
        logprobs, entropies = HFBackend(model, tokenizer, batch_size=4).score(prompts, completions, with_entropy=True)
    finally:
        head.remove()
    assert sum(head.calls) == sum(COMPLETION_LENGTHS)
    assert max(head.calls) <= 64
    with torch.no_grad():
        for s, lp, ent, expected in zip(samples, logprobs, entropies, _full_logit_entropies(model, samples)):
            p, c = s["prompt_token_ids"], s["completion_token_ids"]
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].double()
            expected_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            assert torch.allclose(lp.double(), expected_lp, atol=ATOL, rtol=0)
            assert torch.allclose(ent.double(), expected, atol=ATOL, rtol=0)


# Peak resident bytes of token_logprobs' entropy on (N, V) logits, in units of one (N, V) float32
# tensor, in its own process with freed memory returned to the OS (the train stage's allocator
# setting), so that the peak counts the tensors alive at once.
ENTROPY_PEAK = """
import torch
from pathlib import Path
from rredcot_cli.train import memory
from rredcot_cli.policy.logprobs import token_logprobs
memory.return_freed_memory_to_os()
torch.set_num_threads(1)
n, v = 1024, 16384
logits = torch.randn(n, v, generator=torch.Generator().manual_seed(0))
targets = torch.randint(0, v, (n,))
status = lambda key: next(int(l.split()[1]) * 1024 for l in Path('/proc/self/status').read_text().splitlines()
                          if l.startswith(key + ':'))
token_logprobs(logits, targets, with_entropy=True)  # warm-up: kernels, thread pools
before = status('VmRSS')
Path('/proc/self/clear_refs').write_text('5')
with torch.no_grad():
    token_logprobs(logits, targets, with_entropy=True)
print((status('VmHWM') - before) / (n * v * 4))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak-RSS reset")
def test_the_entropy_holds_one_vocabulary_sized_tensor_less():
    """Beside the logits: their log-softmax and the probabilities, with the entropy terms written
    over the probabilities (three tensors when entr made a fourth)."""
    out = subprocess.run([sys.executable, "-c", ENTROPY_PEAK], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) < 2.5


def test_the_entropy_in_place_is_the_same_as_before():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(1)) * 4
    targets = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(2))
    for top_p in (1.0, 0.9):  # with -inf logits (probability 0) outside the nucleus too
        _, entropies = logprobs_module.token_logprobs(logits, targets, top_p=top_p, with_entropy=True)
        logp = torch.log_softmax(logprobs_module.nucleus_logits(logits, top_p, keep=targets), dim=-1)
        assert torch.equal(entropies, torch.special.entr(logp.exp()).sum(-1))
