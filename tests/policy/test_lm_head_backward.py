"""LogSoftmaxGather (the LM head's log-softmax + gather on the training path): the numbers of
autograd's log_softmax + gather bit for bit (log-probs, entropies, the logits', hidden states' and
head weight's gradients, through the checkpointed chunks), and a backward that holds one
(positions x vocabulary) tensor where autograd held three (issue 42 item 1, the long shape's peak)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rredcot_cli.policy.logprobs as logprobs_module
from rredcot_cli.policy.logprobs import completion_logprobs, token_logprobs
from rredcot_cli.policy.models import build_tiny_model

SMOLLM2_VOCAB = 49_152


class AutogradLogSoftmaxGather:
    """What token_logprobs ran before LogSoftmaxGather: plain autograd ops, the reference."""

    @staticmethod
    def apply(logits: torch.Tensor, targets: torch.Tensor):
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, targets[:, None]).squeeze(-1), logp


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 tensor's bit patterns: equal bits, not merely equal values (-0.0 vs 0.0)."""
    return t.detach().contiguous().view(torch.int32)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _case(rows: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 4
    targets = torch.randint(0, vocab, (rows,), generator=g)
    upstream = torch.randn(rows, generator=g)
    if rows >= 3:  # and some rows with a gradient left
        upstream[0] = 0.0
        upstream[-1] = -0.0  # gather's backward adds it onto a zero: +0.0
    return logits, targets, upstream


# Rows not a multiple of the vector width (8 or 16 floats) nor of the backward's block of rows (21
# at 49k); vocabularies: SmolLM2's, one a block of rows cannot divide, one shorter than a vector.
@pytest.mark.parametrize("rows,vocab", [(37, SMOLLM2_VOCAB), (67, 1000), (1, 7), (5, 3)])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_token_logprobs_equal_autograd_bit_for_bit(rows, vocab, temperature, top_p, monkeypatch):
    logits, targets, upstream = _case(rows, vocab, seed=rows + vocab)
    results = []
    for function in (AutogradLogSoftmaxGather, logprobs_module.LogSoftmaxGather):
        monkeypatch.setattr(logprobs_module, "LogSoftmaxGather", function)
        x = logits.clone().requires_grad_()
        lp, ent = token_logprobs(x, targets, temperature=temperature, top_p=top_p, with_entropy=True)
        lp.backward(upstream)
        results.append((lp, ent, x.grad))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    assert _same_bits(lp_b, lp_a)
    assert _same_bits(ent_b, ent_a)
    assert _same_bits(grad_b, grad_a)
    assert grad_b.abs().sum() > 0  # a gradient was computed, not zeros on both sides


@pytest.mark.parametrize("chunk_tokens", [32, 1024])
def test_checkpointed_head_chunks_give_autograd_gradients_bit_for_bit(chunk_tokens, monkeypatch):
    """_chunked_head_logprobs as the update runs it (head chunks checkpointed, entropies measured):
    the hidden states' and the head weight's gradients equal autograd's, 49k vocabulary."""
    g = torch.Generator().manual_seed(3)
    rows, width = 67, 16
    head = torch.nn.Linear(width, SMOLLM2_VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(SMOLLM2_VOCAB, width, generator=g))
    hidden = torch.randn(rows, width, generator=g)
    targets = torch.randint(0, SMOLLM2_VOCAB, (rows,), generator=g)
    upstream = torch.randn(rows, generator=g)
    results = []
    for function in (AutogradLogSoftmaxGather, logprobs_module.LogSoftmaxGather):
        monkeypatch.setattr(logprobs_module, "LogSoftmaxGather", function)
        head.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_()
        lp, ent = logprobs_module._chunked_head_logprobs(head, h, targets, 1.0, 1.0, True, chunk_tokens)
        (lp * upstream).sum().backward()
        results.append((lp, ent, h.grad, head.weight.grad))
    for got, expected in zip(results[1], results[0]):
        assert _same_bits(got, expected)


@pytest.mark.parametrize("chunk_tokens", [0, 7])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_model_gradients_equal_autograd_bit_for_bit(chunk_tokens, temperature, top_p, monkeypatch):
    """completion_logprobs on a tiny model, one full pass and checkpointed chunks: every
    parameter's gradient is autograd's, bit for bit."""
    torch.manual_seed(0)
    model = build_tiny_model(300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (5, 1, 9)]
    completions = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (17, 3, 30)]
    results = []
    for function in (AutogradLogSoftmaxGather, logprobs_module.LogSoftmaxGather):
        monkeypatch.setattr(logprobs_module, "LogSoftmaxGather", function)
        model.zero_grad(set_to_none=True)
        lp, mask, ent = completion_logprobs(model, prompts, completions, 0, True, temperature=temperature,
                                            top_p=top_p, chunk_tokens=chunk_tokens)
        weights = torch.randn(lp.shape, generator=torch.Generator().manual_seed(5))
        (lp * weights * mask).sum().backward()
        results.append([lp, ent] + [p.grad for p in model.parameters()])
    for got, expected in zip(results[1], results[0]):
        assert _same_bits(got, expected)


def test_a_second_backward_through_the_same_graph_raises():
    """The log-softmax became the first backward's gradient: a second one would compute garbage."""
    logits, targets, upstream = _case(4, 10, seed=6)
    x = logits.requires_grad_()
    lp, _ = logprobs_module.LogSoftmaxGather.apply(x, targets)
    lp.backward(upstream, retain_graph=True)
    with pytest.raises(RuntimeError):
        lp.backward(upstream)


# Peak resident bytes of the LM head's backward, in units of one (N, V) float32 tensor, in its own
# process with freed memory returned to the OS (the train stage's allocator setting), so that the
# peak counts the tensors alive at once. "plain": forward kept (the log-softmax is saved: one unit
# before backward), the peak above what backward started with. "checkpointed": the update's path
# (_chunked_head_logprobs, the chunk recomputed in backward), the peak above the start of backward.
BACKWARD_PEAK = """
import sys
import torch
from pathlib import Path
from rredcot_cli.train import memory
from rredcot_cli.policy import logprobs
memory.return_freed_memory_to_os()
torch.set_num_threads(1)
n, v, width = 1024, 16384, 4
unit = n * v * 4
g = torch.Generator().manual_seed(0)
head = torch.nn.Linear(width, v, bias=False)
hidden = torch.randn(n, width, generator=g)
targets = torch.randint(0, v, (n,), generator=g)
status = lambda key: next(int(l.split()[1]) * 1024 for l in Path('/proc/self/status').read_text().splitlines()
                          if l.startswith(key + ':'))

def plain():
    h = hidden.clone().requires_grad_()
    logits = head(h)  # not saved by the head's backward: freed below
    lp, _ = logprobs.token_logprobs(logits, targets)
    del logits
    return lp

def checkpointed():
    h = hidden.clone().requires_grad_()
    return logprobs._chunked_head_logprobs(head, h, targets, 1.0, 1.0, True, n)[0]

run = {'plain': plain, 'checkpointed': checkpointed}[sys.argv[1]]
run().sum().backward()  # warm-up: kernels, thread pools
head.zero_grad(set_to_none=True)
lp = run()
before = status('VmRSS')
Path('/proc/self/clear_refs').write_text('5')
lp.sum().backward()
print((status('VmHWM') - before) / unit)
"""


def _backward_peak(path: str) -> float:
    out = subprocess.run([sys.executable, "-c", BACKWARD_PEAK, path], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak-RSS reset")
def test_the_backward_allocates_no_vocabulary_sized_tensor():
    """The logits' gradient is written over the saved log-softmax, a block of rows at a time:
    autograd allocated the gather's gradient and the logits' gradient (two more units)."""
    assert _backward_peak("plain") < 0.5


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak-RSS reset")
def test_the_checkpointed_chunk_backward_holds_two_vocabulary_sized_tensors():
    """The update's path: the recomputed logits and their log-softmax (two units, for the forward)
    and then only the log-softmax turned gradient; autograd's backward held three."""
    assert _backward_peak("checkpointed") < 2.5
