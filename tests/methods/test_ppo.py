"""ppo: GAE advantages from a learned critic. Hand-computed tensors for the estimator, a fake
critic for the method, then the CLI on the embedded model: train (critic fitted, saved, resumed)
and attribute with the trained critic."""

import json
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.methods.ppo import gae, masked_whiten, ppo, terminal_rewards
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_terminal_rewards_sit_on_the_last_completion_token():
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    got = terminal_rewards(torch.tensor([1.0, 0.5, 1.0]), mask)
    assert torch.equal(got, torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_minus_value():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    values = torch.tensor([[0.2, 0.5, 0.9], [0.4, 0.1, 7.0]])  # 7.0 sits on padding: ignored
    rewards = terminal_rewards(torch.tensor([1.0, 0.0]), mask)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.5, 0.1], [-0.4, -0.1, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_gae_hand_computed_with_discount_and_lambda():
    # One episode of 3 tokens, R = 1, V = (0.5, 0.6, 0.8), gamma 0.9, lambda 0.5:
    #   delta_2 = 1 + 0.9 * 0 - 0.8        = 0.2
    #   delta_1 = 0 + 0.9 * 0.8 - 0.6      = 0.12
    #   delta_0 = 0 + 0.9 * 0.6 - 0.5      = 0.04
    #   A_2 = 0.2;  A_1 = 0.12 + 0.45 * 0.2 = 0.21;  A_0 = 0.04 + 0.45 * 0.21 = 0.1345
    mask = torch.tensor([[True, True, True, False]])
    values = torch.tensor([[0.5, 0.6, 0.8, 0.0]])
    adv, ret = gae(terminal_rewards(torch.tensor([1.0]), mask), values, mask, gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.1345, 0.21, 0.2, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.6345, 0.81, 1.0, 0.0]]), atol=1e-6)


def test_masked_whiten_normalises_completion_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    got = masked_whiten(x, mask, eps=0.0)
    valid = torch.tensor([1.0, 2.0, 3.0, 5.0])
    expected = (valid - valid.mean()) / valid.std(unbiased=True)
    assert torch.allclose(got[mask], expected)
    assert torch.equal(got[~mask], torch.zeros(2))


class FixedCritic:
    def __init__(self, values):
        self.table = values

    def values(self, prompt_ids, completion_ids):
        assert len(prompt_ids) == len(completion_ids) == self.table.shape[0]
        return self.table.clone()


def _batch():
    # Completion 0: segments of 2 and 1 tokens, reward 1; completion 1: one segment of 2, reward 0.
    seg = torch.tensor([[0, 0, 1], [0, 0, -1]])
    return CreditBatch(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), segment_ids=seg,
                       num_segments=torch.tensor([2, 1]), prompt_token_ids=[[1], [1]],
                       completion_token_ids=[[5, 6, 7], [5, 6]])


def test_ppo_method_hand_computed():
    values = torch.tensor([[0.2, 0.4, 0.7], [0.5, 0.3, 9.0]])  # 9.0 on padding must not leak
    credit = ppo(_batch(), critic=FixedCritic(values), gamma=1.0, lam=1.0, whiten=False, eps=1e-8)
    assert torch.allclose(credit.token_advantages, torch.tensor([[0.8, 0.6, 0.3], [-0.5, -0.3, 0.0]]))
    assert torch.allclose(credit.value_targets, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(credit.token_values, torch.tensor([[0.2, 0.4, 0.7], [0.5, 0.3, 0.0]]))
    # V(S_1) is the value at the first token after segment 0 (0.7); the last segment ends in R.
    assert torch.allclose(credit.segment_values[0], torch.tensor([0.7, 1.0]))
    assert credit.segment_values[1, 0] == 0.0 and torch.isnan(credit.segment_values[1, 1])
    # Credits are summed TD errors: V(S_k) - V(S_{k-1}) with gamma = 1.
    assert torch.allclose(credit.segment_credits[0], torch.tensor([0.7 - 0.2, 1.0 - 0.7]))
    assert torch.isclose(credit.segment_credits[1, 0], torch.tensor(-0.5))


def test_ppo_method_whitens_over_the_batch():
    values = torch.tensor([[0.2, 0.4, 0.7], [0.5, 0.3, 0.0]])
    credit = ppo(_batch(), critic=FixedCritic(values), gamma=1.0, lam=1.0, whiten=True, eps=1e-8)
    raw = torch.tensor([0.8, 0.6, 0.3, -0.5, -0.3])
    expected = (raw - raw.mean()) / raw.std(unbiased=True)
    mask = _batch().token_mask
    assert torch.allclose(credit.token_advantages[mask], expected, atol=1e-6)
    assert credit.token_advantages[1, 2] == 0.0


# ------------------------------------------------------------------ the CLI on the embedded model

TINY = ["seed=1", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
        "train.steps=4", "train.save_every=2", "train.prompts_per_step=2", "train.minibatch_size=4",
        "train.eval_every=0", "train.eval_problems=2", "train.eval_samples=2", "critic.lr=1e-3"]


def rredcot(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def metrics_without_clock(run):
    return pq.read_table(run / "train" / "metrics.parquet").drop(list(CLOCK_COLUMNS)).to_pylist()


def unfinish(run):
    """Turn a finished run into one killed after its step-2 checkpoint (its metrics.parquet stays: a
    killed run's holds the steps up to the kill; the resume keeps those up to the checkpoint)."""
    manifest_path = run / "train" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["status"] = "running"
    manifest_path.write_text(json.dumps(manifest))
    for name in ("eval.parquet", "summary.json"):
        (run / "train" / name).unlink()
    shutil.rmtree(run / "train" / "checkpoints" / "final")


def test_train_ppo_fits_saves_and_resumes_its_critic(tmp_path):
    whole = tmp_path / "whole"
    code, log = rredcot("train", "method=ppo", f"run.dir={whole}", *TINY, cwd=tmp_path)
    assert code == 0, log
    metrics = metrics_without_clock(whole)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["value_loss"] is not None and m["value_loss"] >= 0 for m in metrics)
    assert metrics[-1]["value_loss"] < metrics[0]["value_loss"]  # the critic learns
    critic_file = whole / "train" / "checkpoints" / "final" / "critic.pt"
    assert critic_file.is_file()
    state = torch.load(whole / "train" / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=True)
    assert state["critic"] is not None

    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    unfinish(resumed)
    code, log = rredcot("train", "method=ppo", f"run.dir={resumed}", *TINY, "train.resume=true", cwd=tmp_path)
    assert code == 0, log
    assert "from step 2 of 4" in " ".join(log.split())
    # Equal only if the critic's weights, optimizer and shuffler were restored with the policy's.
    assert metrics_without_clock(resumed) == metrics


def test_attribute_ppo_with_a_trained_critic_and_a_bad_path(tmp_path):
    run = tmp_path / "run"
    code, log = rredcot("train", "method=ppo", f"run.dir={run}", *TINY, "train.steps=2", cwd=tmp_path)
    assert code == 0, log
    common = [f"run.dir={run}", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4",
              "sampling.max_new_tokens=40", "sample.num_prompts=2"]
    for stage in ("sample", "segment"):
        code, log = rredcot(stage, *common, cwd=tmp_path)
        assert code == 0, log
    critic = run / "train" / "checkpoints" / "final" / "critic.pt"
    code, log = rredcot("attribute", "method=ppo", f"critic.init={critic}", *common, cwd=tmp_path)
    assert code == 0, log
    credits = pq.read_table(run / "attribute" / "ppo" / "credits.parquet").to_pylist()
    inner = [c["value"] for c in credits if c["value"] is not None]
    assert inner and any(abs(v) > 1e-6 for v in inner)  # a trained critic's values are not all 0

    code, log = rredcot("attribute", "method=ppo", "critic.init=nowhere/critic.pt", "run.overwrite=true", *common,
                        cwd=tmp_path)
    assert code != 0
    assert "critic.init=nowhere/critic.pt" in log and "Traceback" not in log


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_critic_options_name_only_runs_that_train_a_critic(method):
    from rredcot_cli.config.compose import compose
    from rredcot_cli.store.hashing import config_hash
    from rredcot_cli.methods import get_method
    from rredcot_cli.stages.train import config_keys

    keys = config_keys(get_method(method))
    a = config_hash(compose([f"method={method}"]), keys)
    b = config_hash(compose([f"method={method}", "critic.lr=0.5"]), keys)
    assert (a != b) == (method == "ppo")
