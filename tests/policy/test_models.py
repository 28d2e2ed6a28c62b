"""The character tokenizer, the tiny model builder and the embedded checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from rredcot_cli.config.schema import SFTConfig
from rredcot_cli.benchmarks.synthetic import ChainBenchmark, SearchBenchmark
from rredcot_cli.policy.models import (
    DEFAULT_ALPHABET,
    EMBEDDED_MODEL,
    build_char_tokenizer,
    build_tiny_model,
    count_parameters,
    load_model_and_tokenizer,
    resolve_model_path,
)
from rredcot_cli.policy.model_files import save_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(str(path))
    save_tokenizer(tokenizer, path)
    return path


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    assert tokenizer.encode("ab", add_special_tokens=True) == tokenizer.encode("ab", add_special_tokens=False)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=DEFAULT_ALPHABET, max_size=200))
def test_round_trip_one_token_per_char(tokenizer, text):
    # Special-token strings such as "<|pad|>" inside text are parsed as one special token, as with
    # every HF tokenizer; texts of the benchmarks never contain them.
    assume(not any(tok in text for tok in ("<|pad|>", "<|endoftext|>", "<|unk|>")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids


def test_synthetic_texts_in_alphabet(tokenizer):
    for bench in (ChainBenchmark(1, 30), SearchBenchmark(1, 30)):
        for p in bench.load("test", 20):
            text = bench.prompt(p) + bench.solution(p)
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text


def test_decode_skips_special(tokenizer):
    ids = [tokenizer.pad_token_id] + tokenizer.encode("1+2=3", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "1+2=3"


def test_save_and_auto_load(saved_dir, tokenizer):
    cfg = json.loads((saved_dir / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (saved_dir / "tokenizer.json").exists() and (saved_dir / "model.safetensors").exists()
    auto_tok = AutoTokenizer.from_pretrained(str(saved_dir))
    text = "Compute mod 10: 7 +3\n7+3=0\nAnswer: 0"
    assert auto_tok.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert auto_tok.decode(auto_tok.encode(text, add_special_tokens=False)) == text
    assert auto_tok.eos_token_id == tokenizer.eos_token_id and auto_tok.pad_token_id == tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_pretrained(str(saved_dir))
    assert model.config.vocab_size == len(tokenizer)


def test_load_model_and_tokenizer(saved_dir):
    model, tok = load_model_and_tokenizer(str(saved_dir))
    assert not model.training
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    ids = torch.tensor([tok.encode("1+2=3", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 5, len(tok)) and logits.dtype == torch.float32


def test_build_tiny_model_size(tokenizer):
    model = build_tiny_model(len(tokenizer))
    assert 1_000_000 <= count_parameters(model) <= 2_000_000
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_resolve_model_path():
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_path("/some/dir") == "/some/dir"
    assert Path(resolve_model_path(EMBEDDED_MODEL)).name == "tiny-chain"
    # Shipped models go by their asset names; other bare names are hub ids, paths stay paths.
    assert resolve_model_path("tiny-chain") == resolve_model_path(EMBEDDED_MODEL)
    assert resolve_model_path("gpt2") == "gpt2"
    assert resolve_model_path("./tiny-chain") == "./tiny-chain"
    assert resolve_model_path("..") == ".."


def test_embedded_checkpoint_loads():
    path = Path(resolve_model_path(EMBEDDED_MODEL))
    if not (path / "model.safetensors").exists():
        pytest.skip("embedded checkpoint not built yet (scripts/train_embedded.py)")
    model, tok = load_model_and_tokenizer(EMBEDDED_MODEL)
    assert 1_000_000 <= count_parameters(model) <= 10_000_000
    bench = ChainBenchmark()
    p = bench.load("test", 1)[0]
    text = bench.prompt(p) + bench.solution(p)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_shipped_verbose_model_continues_gold_chain_verbose_lines():
    """tiny-chain-verbose ships with the character tokenizer of tiny-chain, and under teacher
    forcing it predicts every decisive character (value, operation, operand, result, operations
    left) of gold chain_verbose lines for most test problems: the model card's claim, in small."""
    from rredcot_cli.benchmarks.synthetic import ChainVerboseBenchmark

    assert Path(resolve_model_path("tiny-chain-verbose")).name == "tiny-chain-verbose"
    model, tok = load_model_and_tokenizer("tiny-chain-verbose")
    assert count_parameters(model) == 1_587_328
    assert tok.get_vocab() == build_char_tokenizer().get_vocab()
    bench = ChainVerboseBenchmark()
    solved = 0
    for p in bench.load("test", 8):
        text = bench.prompt(p) + bench.solution(p)
        ids = tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)
        start = len(bench.prompt(p))
        digits_and_ops = [i for i in range(start, len(text)) if text[i] in "0123456789+-*"]
        solved += all(predicted[i - 1].item() == ids[i] for i in digits_and_ops)
    assert solved >= 6


def test_shipped_tail_model_writes_the_chain_tail_format():
    """tiny-chain-tail ships with the character tokenizer of tiny-chain and, decoding greedily, ends
    most test chains with the graded Answer line and then exactly four Note lines of the tail's
    words: the model card's claim, in small (greedy: 63 of 64 in the card)."""
    from rredcot_cli.benchmarks.synthetic import ChainTailBenchmark

    assert Path(resolve_model_path("tiny-chain-tail")).name == "tiny-chain-tail"
    model, tok = load_model_and_tokenizer("tiny-chain-tail")
    assert count_parameters(model) == 1_587_328
    assert tok.get_vocab() == build_char_tokenizer().get_vocab()
    bench = ChainTailBenchmark(min_steps=8, max_steps=12)
    in_format = 0
    for p in bench.load("test", 6):
        ids = tok.encode(bench.prompt(p), add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=224, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, len(ids):], skip_special_tokens=True)
        lines = text.split("\n")
        at = next((i for i, line in enumerate(lines) if line.startswith("Answer:")), None)
        tail = [] if at is None else lines[at + 1:]
        words = [w for line in tail for w in line.split()[1:] if not w.isdigit()]
        in_format += (len(tail) == 4 and all(line.startswith("Note: ") for line in tail)
                      and all(w in bench.TAIL_WORDS for w in words))
    assert in_format >= 5


def test_import_rredcot_cli_does_not_import_torch():
    code = "import sys, rredcot_cli, rredcot_cli.benchmarks.synthetic; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_train_sft_smoke(tmp_path):
    """A few SFT steps on a tiny architecture write a folder that loads like any HF model."""
    from rredcot_cli.train.sft import train_sft

    calls = []

    def eval_fn(model, tok, step):
        calls.append(step)
        return {"probe": 1.0}

    settings = SFTConfig(steps=4, batch_size=4, lr=1e-3, weight_decay=0.01, grad_clip=1.0, warmup_steps=2,
                         hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=256,
                         solution_error_rate=0.1)
    out = train_sft(settings, benchmark=ChainBenchmark(1, 3), output_dir=tmp_path / "sft", seed=0, eval_fn=eval_fn,
                    eval_every=2, progress=False)
    assert out["steps"] == 4 and out["loss"] > 0 and out["probe"] == 1.0 and calls == [2, 4]
    model, tok = load_model_and_tokenizer(str(tmp_path / "sft"))
    assert (tmp_path / "sft" / "model.safetensors").exists()
    assert model.config.max_position_embeddings == 256 and tok.eos_token_id == model.config.eos_token_id


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=80), batch_size=st.integers(1, 9),
       seed=st.integers(0, 5))
def test_grouped_by_length_is_a_permutation_with_no_more_padding(lengths, batch_size, seed):
    """Grouping reorders the examples (none lost or repeated) and never pads more than the input order."""
    from rredcot_cli.train.sft import _grouped_by_length

    examples = [([i], [0] * n) for i, n in enumerate(lengths)]
    grouped = _grouped_by_length(examples, batch_size, seed, window_batches=4)
    assert sorted(e[0][0] for e in grouped) == list(range(len(lengths)))

    def padded(seq):
        return sum(max(len(p) + len(c) for p, c in seq[i : i + batch_size]) * len(seq[i : i + batch_size])
                   for i in range(0, len(seq), batch_size))

    # window = 4 batches: within a full window sorting cannot increase the padded total
    full = len(lengths) - len(lengths) % (4 * batch_size)
    assert padded(grouped[:full]) <= padded(examples[:full])


def test_train_sft_rehearsal_mixes_the_requested_fraction(tmp_path, monkeypatch):
    """sft.mix_fraction of the examples come from the rehearsal benchmark, shuffled among the rest."""
    from rredcot_cli.train import sft as sft_module
    from rredcot_cli.benchmarks.synthetic import ChainVerboseBenchmark

    seen = []
    real_collate = sft_module._collate
    monkeypatch.setattr(sft_module, "_collate", lambda batch, pad: (seen.extend(batch), real_collate(batch, pad))[1])
    settings = SFTConfig(steps=5, batch_size=4, lr=1e-3, weight_decay=0.0, grad_clip=1.0, warmup_steps=1,
                         hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=512,
                         solution_error_rate=0.0, mix_fraction=0.25, group_by_length=True)
    sft_module.train_sft(settings, benchmark=ChainVerboseBenchmark(1, 2), output_dir=tmp_path / "m", seed=0,
                         progress=False, mix_benchmark=ChainBenchmark(1, 2, data_seed=7))
    tok = build_char_tokenizer()
    verbose = ["Step" in tok.decode(c) for _, c in seen]
    assert len(seen) == 20 and verbose.count(False) == 5


def test_sft_stage_rejects_a_rehearsal_benchmark_without_solutions(tmp_path):
    from typer.testing import CliRunner

    from rredcot_cli.cli import app

    result = CliRunner().invoke(app, ["sft", f"run.dir={tmp_path}/r", "sft.steps=1", "sft.batch_size=2",
                                      "sft.mix_benchmark=gsm8k", "sft.mix_fraction=0.5"])
    assert result.exit_code != 0
    assert "sft.mix_benchmark=gsm8k" in result.output


def test_sft_stage_fine_tunes_on_the_benchmarks_own_options(tmp_path, monkeypatch):
    """`rredcot sft benchmark=chain_tail benchmark.options.tail_lines=2` trains on targets with
    two tail lines: the stage hands the benchmark its options, as RL on the same config grades."""
    from typer.testing import CliRunner

    from rredcot_cli.cli import app
    from rredcot_cli.train import sft as sft_module

    seen = []
    real_collate = sft_module._collate
    monkeypatch.setattr(sft_module, "_collate", lambda batch, pad: (seen.extend(batch), real_collate(batch, pad))[1])
    result = CliRunner().invoke(app, ["sft", f"run.dir={tmp_path}/r", "benchmark=chain_tail",
                                      "benchmark.options.tail_lines=2", "sft.steps=1", "sft.batch_size=3",
                                      "sft.warmup_steps=1", "sft.hidden_size=16", "sft.num_layers=1",
                                      "sft.num_heads=2", "sft.intermediate_size=32"])
    assert result.exit_code == 0, result.output
    tok = build_char_tokenizer()
    targets = [tok.decode(c, skip_special_tokens=True) for _, c in seen]
    assert len(targets) == 3
    for target in targets:
        after = target.split("Answer:", 1)[1].split("\n")[1:]
        assert len(after) == 2 and all(line.startswith("Note: ") for line in after)
