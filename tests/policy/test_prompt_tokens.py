"""Prompts are tokenised once: the ids a backend samples from are the ids recorded for training,
with exactly one BOS for a tokenizer that adds one, with and without a chat template."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rredcot_cli.policy.base import Completion
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.benchmarks.synthetic import ChainBenchmark
from rredcot_cli.policy.models import build_tiny_model
from rredcot_cli.policy.load import Policy, encode_prompt
from rredcot_cli.pipeline import sample_rows

CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+-*/=:.,?()%! \n"


def bos_tokenizer() -> PreTrainedTokenizerFast:
    """A character tokenizer that prepends <s> like Llama's, with a chat template that writes it."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "<s>": 3}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", padding_side="left")
    tok.chat_template = "{{ bos_token }}User: {{ messages[0]['content'] }}\nAssistant:"
    return tok


class RecordingBackend:
    """Returns a fixed completion and records the prompt ids it was asked to sample from."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def generate(self, prompt_ids, params, seed):
        self.seen.extend(prompt_ids)
        return [[Completion([5, 1], [-0.1, -0.2], "x", "stop") for _ in range(params.n)] for _ in prompt_ids]


@pytest.mark.parametrize("chat_template", [False, True])
def test_sampling_and_training_see_the_same_prompt_tokens_with_one_bos(chat_template):
    tok = bos_tokenizer()
    backend = RecordingBackend()
    policy = Policy(model=None, tokenizer=tok, backend=backend, device="cpu", chat_template=chat_template)
    bench = ChainBenchmark(2, 3)
    problems = bench.load("test", 3)
    rows = sample_rows(policy, bench, problems, n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=0,
                       prompts_per_call=2)
    recorded = [r["prompt_token_ids"] for r in rows[::2]]
    assert recorded == backend.seen
    for ids, row in zip(recorded, rows[::2]):
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1, ids[:5]
        assert tok.decode(ids[1:]) == row["prompt"].removeprefix("<s>")
    if chat_template:
        assert rows[0]["prompt"].startswith("<s>User: ")
        # What naive tokenisation of the templated text would do: BOS twice.
        assert tok(rows[0]["prompt"])["input_ids"][:2] == [3, 3]


def test_encode_prompt_and_hf_generate_agree_on_a_bos_tokenizer():
    tok = bos_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                             pad_token_id=0, eos_token_id=1, bos_token_id=3).eval()
    ids = encode_prompt(tok, "3+4=?\n", chat_template=False)
    assert ids[0] == 3 and ids.count(3) == 1
    backend = HFBackend(model, tok, batch_size=4)
    from rredcot_cli.policy.base import SamplingParams

    completions = backend.generate([ids], SamplingParams(n=2, max_new_tokens=6, temperature=1.0), seed=0)[0]
    scored, _ = backend.score([ids, ids], [c.token_ids for c in completions])
    for c, lp in zip(completions, scored):  # the sampled log-probs were computed from exactly these ids
        assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4)
