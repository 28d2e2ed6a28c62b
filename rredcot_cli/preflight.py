"""Checks a stage runs before it makes its output folder, so a mistake a new user makes ends in
one ``error:`` line (exit 2) with nothing written:

- a model path that exists but holds no model (no ``config.json``, no weights, no tokenizer),
  or a local-looking path that does not exist, instead of the loader's multi-line error;
- a benchmark data path that does not exist, or a folder without the split's file;
- empty work: an input artifact with zero rows (nothing to segment, attribute, judge or draw).

Numeric ranges are checked earlier, when the config is composed (``config.check_ranges``).
``check(stage, cfg)`` is called by the CLI after composing and before the stage runs; it reads
only file names and Parquet footers, never a model or a whole table.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf
import pyarrow.parquet as pq

from rredcot_cli.errors import ArtifactError, ConfigError, RredcotError
from rredcot_cli.methods import get_method, method_and_params
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.policy.model_files import is_gguf, is_package_file, package_file
from rredcot_cli.benchmarks import SYNTHETIC_BENCHMARKS, benchmark_from_settings
from rredcot_cli.data import _looks_local as data_looks_local, _split_file_in_dir
from rredcot_cli.store import runs
from rredcot_cli.store.artifacts import get_spec
from rredcot_cli.policy.models import shipped_model_dir

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Files that make a folder a Hugging Face model: its config, weights (any one), tokenizer (any one).
MODEL_CONFIG = "config.json"
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
                   "adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
MODEL_FIX = ("pass a Hugging Face model folder (config.json, weights, tokenizer), a checkpoint such as "
             "runs/<run>/train/checkpoints/final, a GGUF file, or a hub id")

# What each stage reads: the artifacts (made by earlier stages) and whether it loads model.path.
STAGE_INPUTS = {
    "segment": ("samples",),
    "attribute": ("samples", "segments"),
    "heatmap": ("samples", "segments", "credits", "advantages"),
    "judge": ("samples", "segments"),
}
METHOD_STAGES = ("attribute", "train", "judge")  # the stages that run cfg.method
BENCHMARK_SPLITS = {  # stage -> the config keys naming the splits it reads
    "sample": ("sample.split",),
    "eval": ("eval.split",),
    "train": ("benchmark.train_split", "benchmark.eval_split"),
}


def check(stage: str, cfg: DictConfig) -> None:
    """Refuse, in one line, what would fail after ``stage`` made its folder (see the module doc)."""
    if _loads_model(stage, cfg):
        tokenizer_only = _tokenizer_only(stage, cfg)
        check_model_path(cfg.model.path, "model.path", weights=not tokenizer_only)
        if not tokenizer_only and cfg.backend.name == "hf" and cfg.backend.batch_size < 1:
            raise ConfigError(f"backend.batch_size={cfg.backend.batch_size}: the hf backend needs at least 1 "
                              "sequence per generate call (0, all prompts in one call, is for backend=vllm)")
        _check_critic_init(stage, cfg)
    if stage in BENCHMARK_SPLITS:
        check_benchmark(cfg, [_select(cfg, key) for key in BENCHMARK_SPLITS[stage]])
    if stage in METHOD_STAGES:
        check_forced_answer(cfg)
    for artifact in STAGE_INPUTS.get(stage, ()):
        check_not_empty(stage, cfg, artifact)


def _select(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key)


def _loads_model(stage: str, cfg: DictConfig) -> bool:
    if stage in ("sample", "train", "eval", "judge", "segment"):  # segment: the tokenizer at least
        return True
    if stage == "attribute":
        try:
            return bool(get_method(cfg.method.name).needs)
        except KeyError:
            return False
    return False  # heatmap only tries the tokenizer (and falls back); sft has sft.init


def _tokenizer_only(stage: str, cfg: DictConfig) -> bool:
    """``rredcot segment`` with a rule that needs no entropies reads only the tokenizer."""
    if stage != "segment":
        return False

    try:
        return not needs_entropy(cfg.segment.name)
    except KeyError:  # an unknown rule: the stage names the valid ones
        return False


def _looks_local(path: str) -> bool:
    """A path that cannot be a hub id (``org/name``): absolute, ./ ../ ~, or deeper than one slash."""
    return path.startswith(("/", "./", "../", "~", "\\")) or path.count("/") > 1 or path in (".", "..")


def check_model_path(path: str, key: str = "model.path", weights: bool = True) -> None:
    """``ConfigError`` when ``path`` is a local folder that holds no loadable model (config.json,
    weights unless ``weights`` is False, a tokenizer), a file, or a local-looking path that does
    not exist; hub ids and shipped models' names (``embedded``, ``tiny-chain``) pass (the loader reports what is wrong with them)."""
    if shipped_model_dir(path) is not None:
        return
    if is_package_file(path):
        path = str(package_file(path, key))  # one line with the install command when it is absent
    if is_gguf(path):
        if not Path(path).expanduser().is_file():
            raise ConfigError(f"{key}={path}: no such GGUF file; {MODEL_FIX}")

        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(f"{key}={path}: transformers reads a GGUF file with {' and '.join(missing)}; install "
                              f"{'it' if len(missing) == 1 else 'them'} with `pip install 'rredcot[gguf]'` "
                              f"(or `pip install {' '.join(missing)}`)")
        return  # converted into a cached HF folder when the stage loads it (rredcot_cli/policy/model_files.py)
    folder = Path(path).expanduser()
    if not folder.exists():
        if _looks_local(path):
            raise ConfigError(f"{key}={path}: no such folder; {MODEL_FIX}")
        return  # a hub id
    if not folder.is_dir():
        raise ConfigError(f"{key}={path} is a file, not a model folder; {MODEL_FIX}")
    missing = []
    if weights and not (folder / MODEL_CONFIG).is_file():
        missing.append(MODEL_CONFIG)
    if weights and not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json or tokenizer_config.json)")
    if missing:
        hint = ""
        nested = sorted(p.parent for p in folder.glob(f"*/**/{MODEL_CONFIG}"))[:1]
        if nested:
            hint = f" (a model is in {nested[0]}: pass that folder)"
        raise ConfigError(f"{key}={path}: no model in this folder: it has no {', no '.join(missing)}{hint}; {MODEL_FIX}")


def check_forced_answer(cfg: DictConfig) -> None:
    """A method that scores a forced answer (rredcot with value=answer_probe, delta_belief, loo,
    gradient) needs a template: method.probe_template or the benchmark's ANSWER_PROBE (none for
    benchmark=jsonl with extractor=regex or none, whose answers have no fixed wording)."""
    spec, params = method_and_params(OmegaConf.to_container(cfg.method, resolve=True))
    if not spec.scores_forced_answer(params) or params.get("probe_template"):
        return
    if getattr(benchmark_from_settings(OmegaConf.to_container(cfg.benchmark, resolve=True)), "ANSWER_PROBE", None):
        return
    value = " with method.value=answer_probe" if "value" in params else ""
    extractor = OmegaConf.select(cfg, "benchmark.extractor")
    where = f"benchmark={cfg.benchmark.name} with benchmark.extractor={extractor}" if cfg.benchmark.name == "jsonl" \
        else f"benchmark={cfg.benchmark.name}"
    raise ConfigError(f"method={spec.name}{value} scores a forced answer, but {where} has no answer probe; set "
                      "method.probe_template='...{answer}...' (text after which the answer is read, e.g. "
                      "'\\nThe final answer is {answer}') or choose another method or extractor")


def _check_critic_init(stage: str, cfg: DictConfig) -> None:
    init = cfg.critic.init
    if stage not in ("train", "attribute") or init == "policy":
        return

    try:
        needs = get_method(cfg.method.name).needs
    except KeyError:
        return
    if "critic" in needs and not Path(init).is_file():
        raise ConfigError(f"critic.init={init}: no such file; use critic.init=policy or the critic.pt of a ppo run "
                          f"(RUN/train/checkpoints/final/critic.pt)")


def check_benchmark(cfg: DictConfig, splits: list[str]) -> None:
    """The benchmark can be built (a known name; no path for a generated one) and, for a local
    ``benchmark.path``, the file exists and is not empty, or the folder holds every split's file."""
    # unknown names, a path for a generated benchmark: one line each
    benchmark_from_settings(OmegaConf.to_container(cfg.benchmark, resolve=True))
    path = cfg.benchmark.path
    if path is None or cfg.benchmark.name in SYNTHETIC_BENCHMARKS:
        return
    local = Path(path).expanduser()
    if local.is_file():
        if local.stat().st_size == 0:
            raise ConfigError(f"benchmark.path={path} is an empty file; nothing to draw problems from")
        return
    if local.is_dir():
        for split in dict.fromkeys(splits):
            try:
                file = _split_file_in_dir(local, split)
            except RredcotError as e:
                raise ConfigError(f"benchmark.path={path}: {e}") from None
            if file.stat().st_size == 0:
                raise ConfigError(f"benchmark.path={path}: {file} is empty; nothing to draw problems from")
        return

    if data_looks_local(path):
        raise ConfigError(f"benchmark.path={path}: no such file or folder; give a JSONL/JSON/Parquet file, a folder "
                          f"holding <split>.jsonl files, or an HF hub dataset id")


def check_not_empty(stage: str, cfg: DictConfig, artifact: str) -> None:
    """``ArtifactError`` when the input ``artifact`` of ``stage`` holds no rows (a missing or
    unreadable one is left to the stage, which says how to make it or what is wrong)."""
    try:
        path = runs.find_input(cfg, artifact)
    except ArtifactError:
        return  # missing: the stage says how to make it
    try:
        rows = pq.read_metadata(path).num_rows
    except Exception:  # noqa: BLE001 - the stage's reader names what is wrong with it
        return
    if rows == 0:
        made_by = get_spec(artifact).made_by_stage
        raise ArtifactError(f"input {artifact} {path} holds no rows: nothing to {stage}; remake it with "
                            f"`rredcot {made_by}` on at least one problem (e.g. sample.num_prompts >= 1), "
                            f"or pass inputs.{artifact}=PATH")
