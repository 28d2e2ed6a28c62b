"""The public credit API (``rredcot_cli.credit``, issue 41): what a TRL, verl or slime hook calls.

- it imports and runs with the CLI's dependencies (typer, hydra, omegaconf, rich) unimportable;
- ``compute_credit`` gives what the stages give (``pipeline.segment_rows`` -> ``credit_batch`` ->
  ``attribute``) on the same completions, for an outcome method and a model-based one;
- bad parameters are refused in one line that names the valid ones;
- called on tensors shaped like verl's batch (``prompts``/``attention_mask``, ``responses``,
  ``response_mask``, ``token_level_scores``, ``uid``), it returns (B, R) advantages that are
  verl's GRPO outcome advantage for method grpo (verl itself is not imported: CUDA-only deps).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import resources

import pytest
import torch

from rredcot_cli import pipeline
from rredcot_cli.config.schema import SegmentConfig
from rredcot_cli.credit import compute_credit, method_defaults, policy_from_model
from rredcot_cli.errors import ConfigError
from rredcot_cli.methods import get_method

TINY = str(resources.files("rredcot_cli") / "assets" / "tiny-chain")
TEXTS = ["a=3.\nb=a+4=7.\nc=b*2=14.\nAnswer: 14", "a=3.\nb=a+4=8.\nc=b*2=16.\nAnswer: 16",
         "x=5.\ny=x-1=4.\nAnswer: 4", "x=5.\ny=x-1=3.\nAnswer: 3"]
REWARDS = [1.0, 0.0, 1.0, 0.0]
GROUPS = [0, 0, 1, 1]
GOLD = ["14", "14", "4", "4"]
PRED = ["14", "16", "4", "3"]
PROBE = "Answer: {answer}{eos}"  # the chain benchmark's forced-answer template


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(TINY).eval(), AutoTokenizer.from_pretrained(TINY)


def _ids(tokenizer):
    prompts = [tokenizer("Solve: a=3, b=a+4, c=b*2.\n", add_special_tokens=False)["input_ids"]] * 2 + \
              [tokenizer("Solve: x=5, y=x-1.\n", add_special_tokens=False)["input_ids"]] * 2
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in TEXTS]
    return prompts, completions


def test_imports_and_runs_without_the_cli_dependencies():
    script = textwrap.dedent(f"""
        import importlib.abc, importlib.machinery, sys
        BLOCKED = ("typer", "hydra", "omegaconf", "rich")
        tried = []
        class Refuse(importlib.abc.Loader):
            def create_module(self, spec):
                tried.append(spec.name)
                raise ImportError(f"blocked: {{spec.name}}")
            def exec_module(self, module):
                pass
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    return importlib.machinery.ModuleSpec(name, Refuse())
                return None
        sys.meta_path.insert(0, Block())
        try:
            import rich  # the hook works: this must fail
        except ImportError:
            pass
        else:
            raise SystemExit("the meta-path hook did not block rich")
        tried.clear()
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from rredcot_cli.credit import compute_credit
        tok = AutoTokenizer.from_pretrained({TINY!r})
        model = AutoModelForCausalLM.from_pretrained({TINY!r})
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in {TEXTS!r}]
        for method in ("grpo", "rredcot"):
            result = compute_credit([[5, 6]] * 4, ids, {REWARDS!r}, {GROUPS!r}, tokenizer=tok, method=method,
                                    model=model, sampling_logprobs=[[-1.0] * len(c) for c in ids],
                                    gold_answers={GOLD!r}, pred_answers={PRED!r}, answer_probe={PROBE!r})
            assert result.token_advantages.shape == (4, max(map(len, ids))), result.token_advantages.shape
            assert result.token_advantages.abs().sum() > 0
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
        print("OK", loaded, sorted(set(tried)))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("OK [] "), done.stdout


def _stage_credit(prompts, completions, method, params, tokenizer, policy=None, logprobs=None):
    """The stages' path: samples rows -> segment_rows -> credit_batch -> attribute."""
    samples = [{"prompt_id": f"p{g}", "sample_idx": i, "prompt_token_ids": p, "completion_token_ids": c,
                "completion_logprobs": logprobs[i], "reward": r, "gold_answer": GOLD[i], "pred_answer": PRED[i]}
               for i, (p, c, r, g) in enumerate(zip(prompts, completions, REWARDS, GROUPS))]
    segments = pipeline.segment_rows(samples, tokenizer, SegmentConfig())
    batch = pipeline.credit_batch(samples, segments, answer_probe=PROBE)
    helpers = {} if policy is None else {"policy": policy, "scorer": policy.backend}
    return batch, pipeline.attribute(get_method(method), batch, {**method_defaults(method), **params}, helpers)


@pytest.mark.parametrize("method,params", [("grpo", {}), ("ktae", {}), ("rredcot", {}),
                                           ("rredcot", {"value": "suffix_is"})])
def test_compute_credit_is_the_stages_credit(tiny, method, params):
    model, tokenizer = tiny
    prompts, completions = _ids(tokenizer)
    logprobs = [[-0.5 - 0.01 * t for t in range(len(c))] for c in completions]
    policy = policy_from_model(model, tokenizer)
    batch, expected = _stage_credit(prompts, completions, method, params, tokenizer, policy, logprobs)
    got = compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, method=method,
                         method_params=params, policy=policy, sampling_logprobs=logprobs, gold_answers=GOLD,
                         pred_answers=PRED, answer_probe=PROBE)
    assert torch.equal(got.segment_ids, batch.segment_ids) and int(got.num_segments.min()) >= 2
    torch.testing.assert_close(got.token_advantages, expected.token_advantages, rtol=0, atol=0)
    torch.testing.assert_close(got.segment_credits, expected.segment_credits, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got.segment_values, expected.segment_values, rtol=0, atol=0, equal_nan=True)


def test_bad_parameters_are_refused_in_one_line(tiny):
    _, tokenizer = tiny
    prompts, completions = _ids(tokenizer)
    with pytest.raises(ValueError, match=r"method 'grpo' has no parameter bogus; valid: scale_by_std, eps"):
        compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, method_params={"bogus": 1})
    with pytest.raises(ConfigError, match=r"method_params\.eps=-1"):
        compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, method_params={"eps": -1})
    with pytest.raises(ValueError, match=r"method 'rredcot' needs policy: pass model= \(or policy=\)"):
        compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, method="rredcot")
    with pytest.raises(ValueError, match=r"method 'rredcot' with these parameters reads gold_answers: pass gold_answers="):
        compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, method="rredcot", model=tiny[0],
                       answer_probe=PROBE)
    with pytest.raises(ValueError, match="pass entropies= or model="):
        compute_credit(prompts, completions, REWARDS, GROUPS, tokenizer=tokenizer, segmenter="entropy")


def verl_advantages(data: dict, tokenizer, method: str, **kwargs) -> torch.Tensor:
    """What a verl ``@register_adv_est`` hook does with its batch (docs/trl.md): unpad, call the
    API, pad back to (B, R). ``data`` holds verl's tensors: prompts (B, P) left-padded,
    attention_mask (B, P + R), responses (B, R) right-padded, response_mask (B, R),
    token_level_scores (B, R) (the outcome score on the last response token), old_log_probs (B, R),
    and uid (B,) group ids (strings)."""
    prompt_len = data["prompts"].shape[1]
    prompt_mask = data["attention_mask"][:, :prompt_len].bool()
    response_mask = data["response_mask"].bool()
    prompts = [row[m].tolist() for row, m in zip(data["prompts"], prompt_mask)]
    responses = [row[m].tolist() for row, m in zip(data["responses"], response_mask)]
    logprobs = [row[m].tolist() for row, m in zip(data["old_log_probs"], response_mask)]
    rewards = data["token_level_scores"].sum(dim=-1)
    index: dict[str, int] = {}
    groups = [index.setdefault(uid, len(index)) for uid in data["uid"]]
    result = compute_credit(prompts, responses, rewards, groups, tokenizer=tokenizer, method=method,
                            sampling_logprobs=logprobs, **kwargs)
    advantages = torch.zeros_like(data["token_level_scores"])
    advantages[:, : result.token_advantages.shape[1]] = result.token_advantages
    return advantages * data["response_mask"]


def test_a_verl_shaped_batch_gets_verls_grpo_advantage(tiny):
    _, tokenizer = tiny
    prompts, completions = _ids(tokenizer)
    B, P, R = len(prompts), max(map(len, prompts)), max(map(len, completions)) + 3
    data = {"prompts": torch.full((B, P), tokenizer.pad_token_id), "responses": torch.full((B, R), tokenizer.pad_token_id),
            "attention_mask": torch.zeros(B, P + R, dtype=torch.long), "response_mask": torch.zeros(B, R, dtype=torch.long),
            "token_level_scores": torch.zeros(B, R), "old_log_probs": torch.zeros(B, R),
            "uid": ["a", "a", "b", "b"]}
    for i, (p, c) in enumerate(zip(prompts, completions)):
        data["prompts"][i, P - len(p):] = torch.tensor(p)
        data["attention_mask"][i, P - len(p): P + len(c)] = 1
        data["responses"][i, : len(c)] = torch.tensor(c)
        data["response_mask"][i, : len(c)] = 1
        data["token_level_scores"][i, len(c) - 1] = REWARDS[i]
        data["old_log_probs"][i, : len(c)] = -0.7
    advantages = verl_advantages(data, tokenizer, "grpo")
    # verl's compute_grpo_outcome_advantage: (score - group mean) / (group std + 1e-6), on the response mask
    scores = torch.tensor(REWARDS).view(2, 2)
    expected = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).flatten()
    assert advantages.shape == (B, R)
    torch.testing.assert_close(advantages, expected[:, None] * data["response_mask"], rtol=1e-6, atol=1e-6)
    segmented = verl_advantages(data, tokenizer, "ktae")
    assert segmented.shape == (B, R) and not segmented[data["response_mask"] == 0].any()
