"""The vLLM backend against the HF backend on the embedded tiny model (GPU + vLLM only).

Without CUDA or vLLM only the import-hygiene test runs. On a GPU machine the tests generate from
the embedded model (or, if its checkpoint is not built, a random tiny model of the same
architecture saved to a temp folder) and compare vLLM's scores and sampled log-probs with the HF
model's teacher-forced log-probs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_importing_the_module_does_not_import_vllm():
    code = "import sys, rredcot_cli.backends.vllm; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_request_seeds_are_distinct():
    from rredcot_cli.backends.vllm import request_seed

    seeds = {request_seed(7, i, j, 4) for i in range(10) for j in range(4)}
    assert len(seeds) == 40


torch = pytest.importorskip("torch")


# -- plumbing against a fake vllm module (runs everywhere) --------------------------------------


class _FakeLogprob:
    def __init__(self, logprob):
        self.logprob = logprob


class _FakeLLM:
    """Mimics the few vllm.LLM behaviours the backend relies on."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.model = type("M", (), {"load_weights": lambda self, w: setattr(self, "loaded", list(w))})()
        runner = type("R", (), {"get_model": lambda r: self.model})()
        worker = type("W", (), {"model_runner": runner})()
        driver = type("D", (), {"worker": worker})()
        self.llm_engine = type("E", (), {"model_executor": type("X", (), {"driver_worker": driver})()})()
        self.resets = 0
        self.requests = []

    def generate(self, prompts, params, use_tqdm=True):
        outputs = []
        for k, prompt in enumerate(prompts):
            sp = params[k] if isinstance(params, list) else params
            ids = prompt["prompt_token_ids"]
            self.requests.append((ids, sp))
            if getattr(sp, "prompt_logprobs", None) == 0:
                plp = [None] + [{t: _FakeLogprob(-0.1 * (j + 1))} for j, t in enumerate(ids[1:])]
                out = type("O", (), {"token_ids": [1], "logprobs": None, "finish_reason": "length"})()
                outputs.append(type("Q", (), {"outputs": [out], "prompt_logprobs": plp})())
            else:
                gen = ([5, 6, 1] if (sp.seed or 0) % 2 == 0 else [7, 8, 9])[: sp.max_tokens]
                out = type("O", (), {"token_ids": gen, "logprobs": [{t: _FakeLogprob(-0.5)} for t in gen],
                                     "finish_reason": "stop" if gen[-1] == 1 else "length"})()
                outputs.append(type("Q", (), {"outputs": [out], "prompt_logprobs": None})())
        return outputs

    def reset_prefix_cache(self):
        self.resets += 1


@pytest.fixture
def fake_vllm_backend(monkeypatch, tmp_path):
    import types

    from rredcot_cli import models

    vllm = types.ModuleType("vllm")
    vllm.LLM = _FakeLLM
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    vllm_inputs = types.ModuleType("vllm.inputs")
    vllm_inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", vllm_inputs)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tokenizer = models.build_char_tokenizer()
    models.save_tokenizer(tokenizer, tmp_path)
    from rredcot_cli.backends.vllm import VLLMBackend

    return VLLMBackend(str(tmp_path), dtype="fp32", seed=3)


def test_fake_vllm_generate(fake_vllm_backend):
    from rredcot_cli.backends.base import SamplingParams

    vb = fake_vllm_backend
    assert vb.llm.kwargs["dtype"] == "float32" and vb.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    groups = vb.generate(["ab", "c"], SamplingParams(n=3, max_new_tokens=3, temperature=0.7, top_p=0.9), seed=5)
    assert [len(g) for g in groups] == [3, 3]
    first = groups[0][1]
    assert (first.token_ids, first.finish_reason, first.logprobs) == ([5, 6, 1], "stop", [-0.5] * 3)
    assert first.text == vb.tokenizer.decode([5, 6, 1], skip_special_tokens=True)
    assert groups[0][0].finish_reason == "length"
    sent = vb.llm.requests
    assert [ids for ids, _ in sent] == [vb.encode_prompts(["ab"])[0]] * 3 + [vb.encode_prompts(["c"])[0]] * 3
    assert len({sp.seed for _, sp in sent}) == 6
    assert all(sp.n == 1 and sp.temperature == 0.7 and sp.top_p == 0.9 and sp.logprobs == 0 for _, sp in sent)
    vb.generate(["ab"], SamplingParams(n=1, max_new_tokens=3, temperature=0.0, top_p=0.5), seed=5)
    greedy = vb.llm.requests[-1][1]
    assert greedy.temperature == 0.0 and greedy.top_p == 1.0


def test_fake_vllm_score_and_sync(fake_vllm_backend):
    vb = fake_vllm_backend
    logprobs, entropies = vb.score([[3, 4, 5], [6]], [[7, 8], []])
    assert entropies is None
    assert torch.allclose(logprobs[0], torch.tensor([-0.3, -0.4]))  # positions 3 and 4 of prompt+completion
    assert logprobs[1].shape == (0,)
    with pytest.raises(NotImplementedError, match="entropies"):
        vb.score([[3]], [[4]], with_entropy=True)
    model = torch.nn.Linear(2, 2)
    vb.sync_weights(model)
    assert [name for name, _ in vb.llm.model.loaded] == ["weight", "bias"]
    assert vb.llm.resets == 1


# -- real vLLM on a GPU ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rredcot_cli import models

    path = Path(models.resolve_model_path("embedded"))
    if (path / "config.json").is_file():
        return str(path)
    # Embedded checkpoint not built in this checkout: a random model of the same kind.
    out = tmp_path_factory.mktemp("tiny")
    tokenizer = models.build_char_tokenizer()
    model = models.build_tiny_model(vocab_size=len(tokenizer))
    model.save_pretrained(str(out))
    models.save_tokenizer(tokenizer, out)
    return str(out)


@pytest.fixture(scope="module")
def backends(model_dir):
    from rredcot_cli.backends.hf import HFBackend
    from rredcot_cli.backends.vllm import VLLMBackend
    from rredcot_cli.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir, dtype="float32", device="cuda")
    hf = HFBackend(model, tokenizer, batch_size=16, device="cuda")
    vb = VLLMBackend(model_dir, dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True, seed=0)
    return hf, vb


PROMPTS = ["Q: 3+4=?\nA:", "x = 12\ny = x * 2\n"]


def _hf_logprobs(hf, prompts, groups):
    prompt_ids = hf.encode_prompts(prompts)
    p_rows = [prompt_ids[i] for i, g in enumerate(groups) for _ in g]
    c_rows = [c.token_ids for g in groups for c in g]
    lps, _ = hf.score(p_rows, c_rows)
    return p_rows, c_rows, lps


@pytest.mark.gpu
def test_generate_shapes_and_determinism(backends):
    from rredcot_cli.backends.base import SamplingParams

    _, vb = backends
    params = SamplingParams(n=3, max_new_tokens=24, temperature=1.0, top_p=1.0)
    groups = vb.generate(PROMPTS, params, seed=11)
    assert [len(g) for g in groups] == [3, 3]
    for group in groups:
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) > 0
            assert c.finish_reason in ("stop", "length")
            assert c.finish_reason == "stop" or len(c.token_ids) == 24
            assert c.text == vb.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    again = vb.generate(PROMPTS, params, seed=11)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]


@pytest.mark.gpu
def test_sampled_logprobs_and_score_match_hf(backends):
    from rredcot_cli.backends.base import SamplingParams

    hf, vb = backends
    groups = vb.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=32, temperature=1.0), seed=3)
    p_rows, c_rows, hf_lps = _hf_logprobs(hf, PROMPTS, groups)
    vllm_lps, entropies = vb.score(p_rows, c_rows)
    assert entropies is None
    sampled = [torch.tensor(c.logprobs) for g in groups for c in g]
    for ref, scored, samp in zip(hf_lps, vllm_lps, sampled):
        assert scored.shape == ref.shape == samp.shape
        assert torch.allclose(scored, ref, atol=2e-3), (scored - ref).abs().max()
        assert torch.allclose(samp, ref, atol=2e-3), (samp - ref).abs().max()


@pytest.mark.gpu
def test_score_entropy_not_supported(backends):
    _, vb = backends
    with pytest.raises(NotImplementedError):
        vb.score([[5, 6]], [[7]], with_entropy=True)


@pytest.mark.gpu
def test_sync_weights_changes_scores(backends):
    hf, vb = backends
    prompt_ids = hf.encode_prompts(PROMPTS[:1])
    completion = [[10, 11, 12, 13]]
    before, _ = vb.score(prompt_ids, completion)
    with torch.no_grad():
        for p in hf.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vb.sync_weights(hf.model)
    after, _ = vb.score(prompt_ids, completion)
    ref, _ = hf.score(prompt_ids, completion)
    assert not torch.allclose(before[0], after[0], atol=1e-4)
    assert torch.allclose(after[0], ref[0], atol=2e-3)
