"""Tokenisation with a real BPE tokenizer (SmolLM2's, 49k vocabulary): code that builds token ids
from text pieces must give the tokens the model reads, not the ones a character tokenizer would.
Tests skip when the real model package is absent (tests/conftest.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

PROBE = "The final answer is {answer}{eos}"


def _old_probe_tokens(tokenizer, template: str, answer: str):
    """The pre-issue-27 rule (head and answer + tail tokenised apart), the reference for tokenizers
    that never merge across the join."""
    head, tail = template.split("{answer}", 1)

    def encode(text):
        ids = []
        for i, part in enumerate(text.split("{eos}")):
            if i:
                ids.append(tokenizer.eos_token_id)
            if part:
                ids.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
        return ids

    return tuple(encode(head)), tuple(encode(answer + tail))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# --- answer_probe.probe_tokens: the forced-answer template and the answer, tokenised jointly -------

def test_probe_tokens_bpe_scores_the_space_merged_into_the_answer(smollm2_tokenizer):
    from rredcot_cli.values.answer_probe import probe_tokens

    tok = smollm2_tokenizer
    context, scored = probe_tokens(tok, PROBE, "-3")
    assert [tok.decode([t]) for t in scored] == [" -", "3", tok.eos_token]
    assert list(context) == _ids(tok, "The final answer is")  # the head without its trailing space
    assert list(context + scored) == _ids(tok, "The final answer is -3") + [tok.eos_token_id]
    # Without {eos} the joint ids are exactly the tokenizer's ids of the whole text.
    context, scored = probe_tokens(tok, "\nThe final answer is {answer}", "-3")
    assert list(context + scored) == _ids(tok, "\nThe final answer is -3")
    assert [tok.decode([t]) for t in scored] == [" -", "3"]


def test_probe_tokens_bpe_joint_ids_equal_whole_text_ids(smollm2_tokenizer):
    """On the shipped templates, every answer: context + scored = the tokenizer's ids of the filled-in
    text, and the context is a prefix of the head's own tokens."""
    from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
    from rredcot_cli.values.answer_probe import probe_tokens

    tok = smollm2_tokenizer
    templates = [BoxedMathBenchmark.ANSWER_PROBE, "\nThe final answer is {answer}", "Answer: {answer}"]
    answers = ["-3", "42", "\\frac{1}{2}", "x = 7", "12.5"]
    merged = 0
    for template in templates:
        head, tail = template.split("{answer}", 1)
        for answer in answers:
            context, scored = probe_tokens(tok, template, answer)
            assert list(context + scored) == _ids(tok, head + answer + tail), (template, answer)
            assert list(context) == _ids(tok, head)[: len(context)]
            assert scored
            merged += len(context) < len(_ids(tok, head))
    assert merged  # at least one join really merges (else this test checks nothing new)


def test_answer_candidates_bpe_use_the_joint_tokens(smollm2_tokenizer):
    """rredcot / loo / gradient / delta_belief(targets=verified) take their candidates from
    answer_candidates: the gold and verified answers get the joint split too."""
    from rredcot_cli.methods.rredcot import answer_candidates

    tok = smollm2_tokenizer
    batch = SimpleNamespace(extras={"gold_answers": ["-3", "-3"], "pred_answers": ["-3.0", "5"]},
                            group_ids=torch.tensor([0, 0]), rewards=torch.tensor([1.0, 0.0]))
    cands = answer_candidates(batch, tok, PROBE)
    assert len(cands) == 2 and len(cands[0]) == 2  # gold -3 and the verified -3.0
    head = tuple(_ids(tok, "The final answer is"))
    for cand, answer in zip(cands[0], ["-3", "-3.0"]):
        assert cand.context == head
        assert list(cand.context + cand.answer) == _ids(tok, "The final answer is " + answer) + [tok.eos_token_id]
        assert tok.decode([cand.answer[0]]) == " -"


def test_answer_probe_value_bpe_real_model_matches_teacher_forcing(smollm2_dir, smollm2_tokenizer):
    """On the real 135M model, after a trace that states the answer, the probe's P(answer) is not
    tiny (0.156; the separately tokenised ' ', '-', '3' gave 3e-8) and equals a direct
    teacher-forced forward over the whole text as the tokenizer writes it."""
    from transformers import AutoModelForCausalLM

    from rredcot_cli.values.answer_probe import Candidate, answer_probe_values, probe_tokens

    tok = smollm2_tokenizer
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 - 5?"}], add_generation_prompt=True,
                                     tokenize=False)
    trace = _ids(tok, prompt + "2 - 5 = -3.\n")
    template = "The final answer is {answer}"
    context, scored = probe_tokens(tok, template, "-3")
    value = float(answer_probe_values(model, [trace], [[len(trace)]], [[Candidate(context, scored, 1.0)]])[0][0])

    # Direct: one forward over trace + the tokenizer's ids of the probe text; score what follows the
    # tokens of "The final answer is" (the space belongs to ' -').
    probe_ids = _ids(tok, "The final answer is -3")
    start = len(trace) + len(_ids(tok, "The final answer is"))
    ids = torch.tensor([trace + probe_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    direct = float(torch.exp(sum(logp[t - 1, ids[0, t]] for t in range(start, ids.shape[1]))))
    assert value > 1e-2, value
    assert value == pytest.approx(direct, abs=1e-5)


def test_probe_tokens_char_tokenizer_unchanged():
    """The embedded one-character-per-token tokenizer never merges: the same ids as the old rule."""
    from transformers import AutoTokenizer

    from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
    from rredcot_cli.benchmarks.synthetic import ChainBenchmark
    from rredcot_cli.policy.models import build_char_tokenizer, resolve_model_path
    from rredcot_cli.values.answer_probe import probe_tokens

    templates = [ChainBenchmark.ANSWER_PROBE, BoxedMathBenchmark.ANSWER_PROBE, PROBE,
                 "\nThe final answer is {answer}", "{answer}{eos}", "Answer: {eos}{answer} done{eos}"]
    answers = ["-3", "42", "\\frac{1}{2}", " 7", ""]
    for tok in (build_char_tokenizer(), AutoTokenizer.from_pretrained(resolve_model_path("embedded"))):
        for template in templates:
            for answer in answers:
                assert probe_tokens(tok, template, answer) == _old_probe_tokens(tok, template, answer), (template, answer)
