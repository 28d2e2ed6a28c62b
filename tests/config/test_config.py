"""Config composition: every group option and experiment composes; mistakes give one-line errors."""

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rredcot_cli import methods
from rredcot_cli.config.compose import compose
from rredcot_cli.store.hashing import config_hash
from rredcot_cli.config.search import CONF_DIR, default_options, group_options
from rredcot_cli.errors import ConfigError
from rredcot_cli.methods import MethodSpec

REPO = Path(__file__).resolve().parents[2]


def _fake_spec(name: str, params: type) -> MethodSpec:
    return MethodSpec(name=name, fn=lambda batch, **kw: None, params=params)


def _load(path: Path) -> dict:
    """A conf YAML file as Hydra reads it (OmegaConf's YAML rules, e.g. 1e-6 is a float)."""
    return OmegaConf.to_container(OmegaConf.load(path)) or {}


def _params_from_yaml(name: str) -> type:
    """A params dataclass accepting exactly the keys of conf/method/<name>.yaml."""
    data = _load(CONF_DIR / "method" / f"{name}.yaml")
    fields = [(k, typing.Any, dataclasses.field(default=v)) for k, v in data.items() if k != "name"]
    return dataclasses.make_dataclass(f"Fake_{name}", fields)


@pytest.fixture(autouse=True)
def registered_methods(monkeypatch):
    """Every method option has a registry entry: the real one if it exists, else a fake."""
    registered = methods.method_names()  # imports the real method modules once
    for name in group_options()["method"]:
        if name not in registered:
            monkeypatch.setitem(methods._REGISTRY, name, _fake_spec(name, _params_from_yaml(name)))


@pytest.fixture
def fake_grpo(monkeypatch):
    """Replace grpo's registry entry with a fake declaring one extra parameter, alpha."""

    @dataclasses.dataclass
    class FakeParams:
        scale_by_std: bool = True
        eps: float = 1e-6
        alpha: float = 0.5

    monkeypatch.setitem(methods._REGISTRY, "grpo", _fake_spec("grpo", FakeParams))


def _flatten(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), data


GROUP_OPTIONS = [(g, o) for g, options in group_options().items() for o in options]


def test_groups_and_defaults():
    groups = group_options()
    for group in ["model", "backend", "benchmark", "segment", "method", "experiment"]:
        assert groups[group], group
    assert {"tiny", "qwen2.5-0.5b-instruct", "qwen2.5-math-1.5b", "deepseek-r1-distill-qwen-1.5b"} <= set(groups["model"])
    assert {"quick", "long_chains", "gsm8k_qwen", "math500_r1"} <= set(groups["experiment"])
    defaults = default_options()
    assert defaults["model"] == "tiny" and defaults["method"] == "grpo" and defaults["experiment"] is None


@pytest.mark.parametrize("group, option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_option_composes(group, option):
    cfg = compose([f"{group}={option}"])
    data = _load(CONF_DIR / group / f"{option}.yaml")
    data.pop("defaults", None)
    # An experiment is a global package: its values win over every group's.
    actual = OmegaConf.to_container(cfg if group == "experiment" else cfg[group])
    expected, actual = dict(_flatten(data)), dict(_flatten(actual))
    # A value that reads another group (rredcot's value: ${model.value_estimator}) is kept unresolved
    # in the composed group and resolved against the whole config by the stages.
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for key, value in expected.items():
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            expected[key] = OmegaConf.select(OmegaConf.create(resolved), value[2:-1])
            actual[key] = OmegaConf.select(OmegaConf.create(resolved), f"{group}.{key}") if group != "experiment" else actual[key]
    for key, value in expected.items():
        assert actual[key] == value, key


def test_default_config_is_resolved_and_read_only():
    cfg = compose([])
    assert re.fullmatch(r"runs/\d{8}-\d{6}", cfg.run.dir), cfg.run.dir
    assert "${" not in OmegaConf.to_yaml(cfg)
    assert cfg.method.name == "grpo"
    with pytest.raises(Exception):
        cfg.train.lr = 1.0
    with pytest.raises(Exception):
        cfg.train.new_key = 1


def test_overrides_apply_and_plus_experiment_is_accepted():
    cfg = compose(["experiment=quick", "train.steps=5", "model=qwen2.5-0.5b-instruct"])
    assert cfg.train.steps == 5  # command line beats the preset
    assert cfg.sampling.n == 4  # from the preset
    assert cfg.model.path == "Qwen/Qwen2.5-0.5B-Instruct"  # an explicit group choice beats the preset's
    assert OmegaConf.to_container(compose(["+experiment=quick", "run.dir=x"])) == OmegaConf.to_container(
        compose(["experiment=quick", "run.dir=x"])
    )
    assert compose(["inputs.samples=/data/s.parquet"]).inputs.samples == "/data/s.parquet"
    real = compose(["experiment=gsm8k_qwen"])  # the preset's defaults list picks groups too
    assert (real.model.name, real.backend.name, real.benchmark.name) == ("qwen2.5-0.5b-instruct", "vllm", "gsm8k")


def _error(overrides):
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_group_option():
    valid = ", ".join(group_options()["method"])
    assert _error(["method=nonexistent"]) == f"unknown option 'method=nonexistent'; valid methods: {valid}"
    assert "did you mean grpo?" in _error(["method=gpro"])
    assert _error(["experiment=nope"]).startswith("unknown option 'experiment=nope'; valid experiments: ")


@pytest.mark.parametrize("override", ["train.lrr=1", "+train.lrr=1", "++train.lrr=1"])
def test_misspelled_key(override):
    message = _error([override])
    assert message.startswith("unknown key 'train.lrr'; did you mean train.lr?")


def test_unknown_keys_elsewhere():
    assert "did you mean method?" in _error(["methd=grpo"])
    assert _error(["+foo.bar=3"]).startswith("unknown key 'foo'")
    assert "did you mean inputs.samples?" in _error(["inputs.sample=/x"])
    assert _error(["+inputs.foo=/x"]).startswith("unknown key 'inputs.foo'")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.steps=abc", "train.steps=abc: expected an int"),
        ("train.steps=1.5", "train.steps=1.5: expected an int"),
        ("train.lr=fast", "train.lr=fast: expected a float"),
        ("run.overwrite=maybe", "run.overwrite=maybe: expected a bool (true/false)"),
        ("train.betas=abc", "train.betas=abc: expected a list of floats"),
        ("model.dtype=null", "model.dtype=null: expected a string, not null"),
    ],
)
def test_wrong_type(override, expected):
    assert _error([override]) == expected


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr", "cannot parse override 'train.lr'"),
        ("train.lr=1e-4,3e-4", "is a sweep"),
        ("~train", "deleting keys is not supported"),
        ("--steps", "unknown option '--steps'"),
        ("method.name=dr_grpo", "method=NAME"),
        ("train.steps=${nope}", "cannot resolve train.steps"),
    ],
)
def test_other_mistakes(override, fragment):
    assert fragment in _error([override])


def test_method_params_are_validated(fake_grpo):
    assert compose([]).method.alpha == 0.5  # defaults come from the params dataclass
    cfg = compose(["method.alpha=2", "+method.eps=1e-3"])
    assert cfg.method.alpha == 2.0 and cfg.method.eps == pytest.approx(1e-3)
    message = _error(["method.alpah=2"])
    assert message.startswith("unknown key 'method.alpah' for method 'grpo'; did you mean method.alpha?")
    assert "scale_by_std, eps, alpha" in message
    assert _error(["method.alpha=abc"]) == "method.alpha=abc: expected a float"


def test_method_without_params_and_unregistered_method(monkeypatch):
    monkeypatch.setitem(methods._REGISTRY, "dr_grpo", _fake_spec("dr_grpo", dataclasses.make_dataclass("P", [])))
    assert "takes no parameters" in _error(["method=dr_grpo", "method.eps=1"])
    monkeypatch.delitem(methods._REGISTRY, "dr_grpo")
    assert "no registered implementation" in _error(["method=dr_grpo"])


def test_config_hash_is_stable():
    a = compose(["run.dir=a", "train.lr=1e-4"])
    b = compose(["run.dir=b", "train.lr=0.0001"])
    assert re.fullmatch(r"[0-9a-f]{12}", config_hash(a, ["train", "seed"]))
    assert config_hash(a, ["train", "seed"]) == config_hash(b, ["seed", "train"])  # order, run.dir
    assert config_hash(a, ["train"]) != config_hash(compose(["train.lr=2e-4"]), ["train"])
    with pytest.raises(KeyError):
        config_hash(a, ["nope"])
    code = (
        "from rredcot_cli.config.compose import compose; from rredcot_cli.store.hashing import config_hash;"
        "print(config_hash(compose(['run.dir=a', 'train.lr=1e-4']), ['train', 'seed']))"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == config_hash(a, ["train", "seed"])


def test_every_execution_key_is_an_option_and_names_no_run():
    """schema.EXECUTION_KEYS, the one rule for the keys that say how a run executes: each is a
    real option, and changing one leaves a training run's hash (and config.yaml) unchanged."""
    from omegaconf import OmegaConf

    from rredcot_cli.store.hashing import config_hash
    from rredcot_cli.config.schema import EXECUTION_KEYS, Config
    from rredcot_cli.stages.train import CONFIG_KEYS, _hashed_config

    defaults = OmegaConf.structured(Config)
    for key in EXECUTION_KEYS:
        assert OmegaConf.select(defaults, key, default="<missing>") != "<missing>", key
    base = config_hash(_hashed_config(compose([])), CONFIG_KEYS)
    assert config_hash(_hashed_config(compose(["train.save_every=3", "backend.num_threads=2",
                                                "train.micro_batch_tokens=256", "train.resume=true"])),
                       CONFIG_KEYS) == base
    assert config_hash(_hashed_config(compose(["train.lr=1e-4"])), CONFIG_KEYS) != base


def test_every_config_field_is_documented_where_it_is_declared():
    """cleanrl's rule: each field of the schema carries a comment (above it, or on its line) saying
    what it means, so `rredcot_cli/config/schema.py` is the reference of every option."""
    import ast

    source = (REPO / "rredcot_cli" / "config" / "schema.py").read_text()
    lines = source.splitlines()
    undocumented = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if isinstance(node, ast.AnnAssign):
                own = lines[node.lineno - 1 : node.end_lineno]
                above = lines[node.lineno - 2].strip()
                if not (any("#" in line for line in own) or above.startswith("#")):
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert not undocumented, f"document these fields in rredcot_cli/config/schema.py: {undocumented}"


def test_the_model_presets_value_estimator_changes_no_hash():
    """model.value_estimator reaches a stage only through method.value, so the model group's hash
    (and with it every sample made before the key existed) stays what it was: e1f4b8fac302 is the
    default model's hash at 9706c73, before it."""
    default = compose([])
    assert config_hash(default, ["model"]) == "e1f4b8fac302"
    assert config_hash(compose(["model.value_estimator=answer_share"]), ["model"]) == "e1f4b8fac302"
    # ... while the method that reads it does change.
    assert config_hash(compose(["method=rredcot"]), ["method"]) != \
        config_hash(compose(["method=rredcot", "model.value_estimator=answer_share"]), ["method"])


def test_every_choice_field_defaults_to_a_choice_and_the_wings_accept_exactly_those():
    """A ``one_of`` field's choices are the only place its values are listed: its default is one,
    and the wings that still keep a tuple of names (until they read the schema's) hold the same."""
    from rredcot_cli.config.schema import Config, TrainConfig, choices
    from rredcot_cli.train.loss import LOSS_AGGREGATIONS, SAMPLER_CORRECTIONS
    from rredcot_cli.train.update import OLD_LOGPROBS

    groups = [value for value in vars(Config()).values() if dataclasses.is_dataclass(value)]
    declared = [(g, f) for g in groups for f in dataclasses.fields(g) if "choices" in f.metadata]
    assert len(declared) >= 7
    for group, f in declared:
        assert getattr(group, f.name) in f.metadata["choices"], f"{type(group).__name__}.{f.name}"
    assert choices(TrainConfig, "loss_agg") == LOSS_AGGREGATIONS
    assert choices(TrainConfig, "sampler_correction") == SAMPLER_CORRECTIONS
    assert choices(TrainConfig, "old_logprobs") == OLD_LOGPROBS


@pytest.mark.parametrize("overrides,expected", [
    (["train.kl_estimator=k2"], "train.kl_estimator=k2: not a valid choice; valid: k1, k3"),
    (["train.old_logprobs=sampler", "train.sampler_correction=token_mask"],
     "train.old_logprobs=sampler with train.sampler_correction=token_mask: the correction compares"),
    (["train.clip_ratio_c=1.0"], "train.clip_ratio_c=1.0: the dual clip needs > 1"),
])
def test_train_choices_and_cross_checks_fail_at_compose_time(overrides, expected):
    with pytest.raises(ConfigError) as error:
        compose(overrides)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


def test_the_segment_choices_are_the_registered_rules():
    from rredcot_cli.config.schema import SegmentConfig, choices
    from rredcot_cli.segmenters import SEGMENTERS

    assert set(choices(SegmentConfig, "name")) == set(SEGMENTERS)
