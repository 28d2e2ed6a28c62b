"""row_stream.RowStream: draws for the live rows only give the tokens, and leave the generator
where, ``torch.multinomial`` over the whole batch would; and the HF backend's decode samples the
same tokens with it as with that multinomial, on the embedded model, rows finishing at different
lengths."""

from __future__ import annotations

import pytest
import torch

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.policy import row_stream
from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.load import encode_prompt, format_prompt
from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path


def _whole_batch_multinomial(probs: torch.Tensor, rows: list[int], batch_rows: int, pad_id: int) -> torch.Tensor:
    """What the decode did before row_stream: every original row draws, a finished one from a point mass."""
    full = torch.zeros((batch_rows, probs.shape[1]))
    full[:, pad_id] = 1.0
    full[rows] = probs
    return torch.multinomial(full, num_samples=1).squeeze(1)[rows]


@pytest.mark.parametrize("threads", [1, 2])
def test_live_rows_draw_what_multinomial_over_the_batch_draws(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        vocab, batch_rows = 1003, 11  # a vocabulary of no round size
        picks = torch.Generator().manual_seed(0)
        for trial in range(40):
            k = int(torch.randint(1, batch_rows + 1, (1,), generator=picks))
            rows = sorted(torch.randperm(batch_rows, generator=picks)[:k].tolist())
            # peaked enough that a misplaced draw picks another token
            probs = torch.softmax(torch.randn(k, vocab, generator=picks), dim=-1)
            torch.manual_seed(trial)
            expected = [_whole_batch_multinomial(probs, rows, batch_rows, pad_id=0) for _ in range(3)]
            after_expected = torch.rand(4)
            torch.manual_seed(trial)
            stream = row_stream.RowStream(batch_rows, vocab)
            got = [stream.sample(probs, rows) for _ in range(3)]
            assert all(torch.equal(a, b) for a, b in zip(expected, got)), (trial, rows)
            assert torch.equal(torch.rand(4), after_expected)  # the generator ends where it would have
    finally:
        torch.set_num_threads(previous)


def test_a_torch_whose_exponentials_differ_keeps_the_whole_batch_draw(monkeypatch):
    """supported() checks the stream layout it reproduces against this torch's exponential_."""
    assert row_stream.supported(torch.device("cpu")) and not row_stream.supported(torch.device("meta"))
    monkeypatch.setattr(row_stream, "_exponentials", lambda numbers, generator=None: torch.empty(numbers).exponential_(
        generator=generator) + 1e-7)
    row_stream._layout_holds.cache_clear()
    try:
        assert not row_stream.supported(torch.device("cpu"))
    finally:
        monkeypatch.undo()
        row_stream._layout_holds.cache_clear()
    assert row_stream.supported(torch.device("cpu"))


def test_sample_rejects_probs_that_do_not_fit_the_rows():
    with pytest.raises(ValueError, match="probs of shape"):
        row_stream.RowStream(4, 10).sample(torch.full((2, 10), 0.1), [0, 1, 2])


@pytest.fixture(scope="module")
def embedded():
    model, tokenizer = load_model_and_tokenizer(resolve_model_path("embedded"), dtype="float32", device="cpu")
    bench = make_benchmark("chain", min_steps=2, max_steps=12)  # answers of very different lengths
    prompts = [encode_prompt(tokenizer, format_prompt(tokenizer, bench.prompt(p), False), False)
               for p in bench.load("train", limit=5)]
    return model.eval(), tokenizer, prompts


@pytest.mark.parametrize("params", [SamplingParams(n=4, max_new_tokens=200, temperature=1.0),
                                    SamplingParams(n=3, max_new_tokens=200, temperature=0.7, top_p=0.9)],
                         ids=["t1", "t0.7-top-p0.9"])
def test_decode_samples_what_it_sampled_before(embedded, params, monkeypatch):
    """Same seed: the token ids (and log-probs) of the decode with row_stream equal those of the
    decode that drew over the whole batch with multinomial (row_stream switched off), which are
    also transformers' generate's; rows finish at different lengths and leave the batch."""
    model, tokenizer, prompts = embedded
    torch.set_num_threads(1)
    backend = HFBackend(model, tokenizer, batch_size=16)

    def whole_batch_draw(*args, **kwargs):
        raise AssertionError("the decode drew over the whole batch")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "multinomial", whole_batch_draw)
        after = [c for group in backend.generate(prompts, params, seed=3) for c in group]
    monkeypatch.setattr(row_stream, "supported", lambda device: False)
    before = [c for group in backend.generate(prompts, params, seed=3) for c in group]
    backend.compact = False
    generate = [c for group in backend.generate(prompts, params, seed=3) for c in group]
    lengths = [len(c.token_ids) for c in after]
    assert len(set(lengths)) >= 4 and min(lengths) * 2 < max(lengths), lengths  # a tail, rows leaving
    assert sum(c.finish_reason == "stop" for c in after) == len(after)
    assert [c.token_ids for c in after] == [c.token_ids for c in before] == [c.token_ids for c in generate]
    assert [c.logprobs for c in after] == [c.logprobs for c in before]
