"""Oracle lane, the TRL integration (issue 41): ``SegmentCreditGRPOTrainer`` against TRL 1.16.

- With method grpo (TRL's eps 1e-4) the integration's per-token advantages are TRL's own (B,)
  advantages on every completion token and 0 past its end, on the same generated batch; and
  TRL's ``_compute_loss`` gives the same loss and gradients with them as with TRL's, for every
  ``loss_type``, clipping active (old log-probs offset from the model's).
- With rredcot, cscr and ktae, a 2-step run on the shipped tiny-chain model completes, and the
  credit columns it logged are the ones the toolkit's own stage path (``pipeline.segment_rows``,
  ``credit_batch``, ``attribute``) computes on the same completions with the same weights.

Skips without TRL (``pip install trl==1.16.0``).
"""

from __future__ import annotations

import copy
import math
import tempfile
from importlib import resources

import pytest
import torch

pytest.importorskip("trl", minversion="1.16")

from trl_oracle import PROMPT, _tiny_model, _tokenizer, reward_from_column, trainer_attrs  # noqa: E402

from rredcot_cli import pipeline  # noqa: E402
from rredcot_cli.benchmarks import make_benchmark  # noqa: E402
from rredcot_cli.config.schema import SegmentConfig  # noqa: E402
from rredcot_cli.credit import CreditResult, credit_statistics, method_defaults, policy_from_model  # noqa: E402
from rredcot_cli.integrations import trl as integration  # noqa: E402
from rredcot_cli.methods import get_method  # noqa: E402

pytestmark = pytest.mark.oracle

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]  # two groups of four, both with differing rewards


def _args(**overrides):
    from trl import GRPOConfig

    settings = dict(output_dir=tempfile.mkdtemp(prefix="trl-credit-"), per_device_train_batch_size=4,
                    num_generations=4, max_completion_length=8, report_to="none", bf16=False, use_cpu=True,
                    beta=0.0, save_strategy="no", gradient_checkpointing=False, use_bias_correction_kl=False)
    settings.update(overrides)
    return GRPOConfig(**settings)


def _pair():
    """TRL's GRPOTrainer and the integration's, on identical tiny models, in train mode."""
    from datasets import Dataset
    from trl import GRPOTrainer

    tokenizer = _tokenizer()
    data = Dataset.from_list([{"prompt": PROMPT, "reward": 0.0}] * 4)
    trl_trainer = GRPOTrainer(model=_tiny_model(tokenizer), reward_funcs=reward_from_column, args=_args(),
                              train_dataset=data, processing_class=tokenizer)
    ours = integration.SegmentCreditGRPOTrainer(
        model=_tiny_model(tokenizer), reward_funcs=reward_from_column, args=_args(), train_dataset=data,
        processing_class=tokenizer, credit_method="grpo", method_params={"eps": 1e-4})
    for trainer in (trl_trainer, ours):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    return trl_trainer, ours


def _generated(trainer, rows):
    torch.manual_seed(7)  # the same sampled completions from both (identical weights)
    return trainer._generate_and_score_completions(rows)


def test_grpo_advantages_loss_and_gradients_equal_trls():
    trl_trainer, ours = _pair()
    rows = [{"prompt": PROMPT, "reward": r} for r in REWARDS]
    expected, got = _generated(trl_trainer, rows), _generated(ours, rows)
    assert torch.equal(expected["completion_ids"], got["completion_ids"])
    mask = got["completion_mask"].bool()
    assert got["advantages"].shape == mask.shape
    broadcast = expected["advantages"][:, None].expand_as(mask)
    torch.testing.assert_close(got["advantages"][mask], broadcast[mask], rtol=1e-5, atol=1e-6)
    assert not got["advantages"][~mask].any()
    assert expected["advantages"].abs().max() > 0.5  # the groups differ: a real advantage

    offsets = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3)) * 0.3
    for loss_type in LOSS_TYPES:
        results = []
        for trainer, inputs in ((trl_trainer, expected), (ours, got)):
            with torch.no_grad():
                ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
                attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
                logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, mask.shape[1])
            batch = {**inputs, "old_per_token_logps": logps - offsets}
            trainer.model.zero_grad()
            with trainer_attrs(trainer, loss_type=loss_type):
                loss = trainer._compute_loss(trainer.model, batch)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]))
        (loss_trl, grads_trl), (loss_ours, grads_ours) = results
        torch.testing.assert_close(loss_ours, loss_trl, rtol=1e-5, atol=1e-7, msg=loss_type)
        assert len(grads_ours) == len(grads_trl) > 0
        for g_ours, g_trl in zip(grads_ours, grads_trl):
            torch.testing.assert_close(g_ours, g_trl, rtol=1e-4, atol=1e-7, msg=loss_type)


# ------------------------------------------------------------------------------------------
# 2-step runs on the shipped model
# ------------------------------------------------------------------------------------------


class Recorder:
    """Wraps the integration's ``compute_credit``: keeps its inputs and the weights at that moment."""

    def __init__(self, trainer_ref: list):
        self.calls: list[dict] = []
        self.trainer_ref = trainer_ref

    def __call__(self, *args, **kwargs):
        model = self.trainer_ref[0].accelerator.unwrap_model(self.trainer_ref[0].model)
        self.calls.append({"args": copy.deepcopy(args), "kwargs": {k: v for k, v in kwargs.items()
                                                                   if k not in ("policy", "tokenizer")},
                           "state": {k: v.detach().clone() for k, v in model.state_dict().items()}})
        return integration_compute_credit(*args, **kwargs)


integration_compute_credit = integration.compute_credit


def _toolkit_stats(call: dict, method: str, params: dict, tokenizer, model) -> dict:
    """The logged columns as the stages compute them: samples rows -> segment_rows ->
    credit_batch -> attribute, with the weights the trainer had then."""
    prompt_ids, completion_ids, rewards, group_ids = call["args"]
    kw = call["kwargs"]
    samples = [{"prompt_id": f"p{int(g)}", "sample_idx": i, "prompt_token_ids": p, "completion_token_ids": c,
                "completion_logprobs": kw["sampling_logprobs"][i] if kw["sampling_logprobs"] else [0.0] * len(c),
                "reward": float(r), "gold_answer": kw["gold_answers"][i], "pred_answer": kw["pred_answers"][i],
                "benchmark": "chain"}
               for i, (p, c, r, g) in enumerate(zip(prompt_ids, completion_ids, rewards.tolist(), group_ids.tolist()))]
    segments = pipeline.segment_rows(samples, tokenizer, SegmentConfig())
    batch = pipeline.credit_batch(samples, segments, answer_probe=kw["answer_probe"])
    model.load_state_dict(call["state"])
    policy = policy_from_model(model, tokenizer)
    credit = pipeline.attribute(get_method(method), batch, {**method_defaults(method), **params},
                                {"policy": policy, "scorer": policy.backend})
    return credit_statistics(CreditResult(credit=credit, batch=batch))


@pytest.mark.parametrize("method,params", [("rredcot", {}), ("cscr", {"condition": "answer_hint"}), ("ktae", {})])
def test_two_step_run_logs_the_toolkits_credit(monkeypatch, method, params):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(resources.files("rredcot_cli") / "assets" / "tiny-chain")
    tokenizer = AutoTokenizer.from_pretrained(path)
    benchmark = make_benchmark("chain", min_steps=2, max_steps=2)
    problems = benchmark.load("train", limit=4)
    data = Dataset.from_list([{"prompt": benchmark.prompt(p), "gold": p.gold_answer} for p in problems])

    def correct(completions, gold, **_):
        return [float(benchmark.extract_answer(c) == g) for c, g in zip(completions, gold)]

    trainer_ref: list = []
    recorder = Recorder(trainer_ref)
    monkeypatch.setattr(integration, "compute_credit", recorder)
    torch.manual_seed(0)
    trainer = integration.SegmentCreditGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=correct, train_dataset=data,
        processing_class=tokenizer, credit_method=method, method_params=params, answer_column="gold",
        extract_answer=benchmark.extract_answer, answer_probe=benchmark.ANSWER_PROBE,
        # seed 1: the first step draws a group with differing rewards (checked below)
        # gradient_checkpointing: TRL's default, under which a model in train mode returns no KV cache
        args=_args(max_steps=2, seed=1, per_device_train_batch_size=8, max_completion_length=40,
                   gradient_checkpointing=True, logging_steps=1, learning_rate=1e-3, temperature=1.0))
    trainer_ref.append(trainer)
    trainer.train()

    logged = [row for row in trainer.state.log_history if "credit/advantage_std" in row]
    assert len(logged) == len(recorder.calls) == 2
    assert all("loss" in row and "reward" in row for row in logged)  # TRL's own columns stay
    assert any(row["credit/advantage_std"] > 0 for row in logged)  # a group with differing rewards
    scorer = AutoModelForCausalLM.from_pretrained(path)
    for row, call in zip(logged, recorder.calls):
        expected = _toolkit_stats(call, method, params, tokenizer, scorer)
        assert expected.keys() == {k.removeprefix("credit/") for k in row if k.startswith("credit/")} - {"forward_tokens"}
        for name, value in expected.items():
            assert math.isclose(row[f"credit/{name}"], value, rel_tol=1e-5, abs_tol=1e-6), (method, name)


def test_bad_method_settings_fail_before_trl_builds_anything():
    with pytest.raises(ValueError, match=r"method 'grpo' has no parameter bogus; valid: scale_by_std, eps"):
        integration.SegmentCreditGRPOTrainer(model=None, credit_method="grpo", method_params={"bogus": 1})
    with pytest.raises(KeyError, match="unknown method 'nope'"):
        integration.SegmentCreditGRPOTrainer(model=None, credit_method="nope")
