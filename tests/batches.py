"""Hand-made credit batches shared by the method tests."""

import math

import torch

from rredcot_cli.methods import get_method
from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.pipeline import attribute, credit_rows


def batch_from_segments(rewards, groups, seg_lengths, padding=0):
    """seg_lengths[i] = token counts of completion i's segments, then ``padding`` more columns
    of padding after the longest completion."""
    T = max(sum(s) for s in seg_lengths) + padding
    ids = torch.full((len(rewards), T), -1, dtype=torch.long)
    for i, lengths in enumerate(seg_lengths):
        t = 0
        for k, n in enumerate(lengths):
            ids[i, t : t + n] = k
            t += n
    return CreditBatch(rewards=torch.tensor(rewards, dtype=torch.float32), group_ids=torch.tensor(groups),
                       segment_ids=ids, num_segments=torch.tensor([len(s) for s in seg_lengths]))


def tiny_chain_credit_batch():
    """The embedded policy, four samples of one 4-step chain problem (two gold completions and
    two that miscompute step 1, then carry on consistently), and a maker of their credit batch,
    segmented by newline: (policy, samples, make_batch)."""
    from rredcot_cli.benchmarks.synthetic import ChainBenchmark, apply_op
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy
    from rredcot_cli.pipeline import credit_batch, segment_rows
    from rredcot_cli.config.schema import SegmentConfig

    policy = load_policy(ModelConfig(chat_template=False), BackendConfig(device="cpu"), seed=0)
    bench = ChainBenchmark(4, 4)
    problem = bench.load("test", 1)[0]
    value, lines = problem.meta["start"], []
    for k, op in enumerate(problem.meta["ops"]):
        result = apply_op(value, op[0], int(op[1:]))
        if k == 1:
            result = (result + 3) % 10
        lines.append(f"{value}{op}={result}")
        value = result
    wrong = "\n".join(lines) + f"\nAnswer: {value}"
    tok = policy.tokenizer
    prompt = bench.prompt(problem)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]

    def sample(text, idx):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return {"prompt_id": problem.prompt_id, "sample_idx": idx, "prompt": prompt, "prompt_token_ids": prompt_ids,
                "completion": text, "completion_token_ids": ids, "completion_logprobs": [0.0] * len(ids),
                "reward": bench.verify(text, problem), "gold_answer": problem.gold_answer,
                "pred_answer": bench.extract_answer(text), "benchmark": bench.name}

    gold = bench.solution(problem)
    samples = [sample(gold, 0), sample(wrong, 1), sample(gold, 2), sample(wrong + "\n", 3)]
    assert [s["reward"] for s in samples] == [1.0, 0.0, 1.0, 0.0]
    segments = segment_rows(samples, tok, SegmentConfig(name="newline", tokens=32, min_tokens=1,
                            max_segments=40))
    return policy, samples, lambda: credit_batch(samples, segments, answer_probe=bench.ANSWER_PROBE)


def run_method(tiny_chain, name, **overrides):
    """One method through the stage's own path (attribute -> credit_rows) on ``tiny_chain``'s batch,
    with its default parameters updated by ``overrides``, checking what every method must give:
    one advantage per completion token, finite credits, zero on padding, and no value in the rows
    of a method that estimates none. Returns (batch, credit)."""
    policy, samples, make_batch = tiny_chain
    batch = make_batch()
    spec = get_method(name)
    credit = attribute(spec, batch, {**spec.params().__dict__, **overrides}, {"policy": policy})
    credits, advantages = credit_rows(samples, batch, credit, name)
    assert [len(a["token_advantages"]) for a in advantages] == [len(s["completion_token_ids"]) for s in samples]
    assert all(math.isfinite(r["credit"]) for r in credits)
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)
    if credit.segment_values is None:
        assert all(r["value"] is None for r in credits)
    return batch, credit
