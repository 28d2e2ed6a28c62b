"""Turn command-line overrides into one validated, resolved config (Hydra Compose API).

``compose(["method=dr_grpo", "train.lr=1e-4"])`` composes ``conf/config.yaml``
(typed by ``rredcot_cli.config.schema.Config``) with the overrides, checks it, and returns a resolved,
read-only ``DictConfig``. Every mistake a user can make on the command line becomes a
``ConfigError`` with a one-line message:

- unknown group option:   unknown option 'method=nonexistent'; valid methods: dr_grpo, grpo
- unknown key:            unknown key 'train.lrr'; did you mean train.lr? Valid keys under train: ...
- wrong type:             train.steps=abc: expected an int
- unknown method param:   unknown key 'method.epz' for method 'grpo'; did you mean method.eps? ...
- out of range:           sampling.top_p=1.5: must be in (0, 1]   (schema.RANGES, a method's ranges)
- not a method's choice:  method.value=foo: not a valid choice; valid: suffix_is, answer_probe
                          (a ``Literal[...]`` field of the method's params dataclass)

Overrides follow Hydra: ``group=option``, ``key=value``, ``+key=value`` (add), ``experiment=NAME``
(also accepted as ``+experiment=NAME``). ``method.<param>=value`` may set any parameter the
chosen method declares, whether or not its YAML lists it.

The search path and the groups' options are in ``config.search``, the one-line messages in
``config.messages``, the range checks in ``config.ranges``; this module composes.

Nothing here imports Hydra, OmegaConf, yaml, the schema, the registries or torch at import time:
the CLI imports this module for ``rredcot --help``, so they are imported inside the functions that
use them (each such import is marked "deferred").
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence
from datetime import datetime

from rredcot_cli.config.messages import (describe_type, parse_error, schema_fields, translate, unknown_key,
                                         unknown_option, wrong_type, yaml_error)
from rredcot_cli.config.ranges import check_ranges
from rredcot_cli.config.search import CONF_DIR, CONFIG_NAME, config_file, group_options, user_config_dirs
from rredcot_cli.errors import ConfigError, one_line
from rredcot_cli.plugins import import_plugin, plugin_options

if TYPE_CHECKING:
    from omegaconf import DictConfig

SCHEMA_NAME = "rredcot_schema"  # the ConfigStore entry config.yaml extends
_OPTIONAL_GROUPS = ("experiment",)  # groups whose default is "none"


def _parse_overrides(overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()) -> tuple[list[str], list[tuple[str, Any]]]:
    """Check the overrides and split them: (overrides for Hydra, ``method.*`` overrides).

    ``method.<param>=v`` overrides are applied after the method's parameters are known.
    """
    # deferred: --help
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    groups = group_options(config_dirs)
    hydra_overrides: list[str] = []
    method_overrides: list[tuple[str, Any]] = []
    for text in overrides:
        if text.startswith("-"):
            raise ConfigError(f"unknown option '{text}'; overrides look like key=value (e.g. train.steps=3)")
        try:
            ov = parser.parse_overrides([text])[0]
        except OverrideParseException as e:
            raise parse_error(str(e)) from e
        key = ov.key_or_group
        if ov.is_sweep_override():
            raise ConfigError(
                f"'{text}' is a sweep; rredcot runs one config per command: loop in the shell, "
                "e.g. for lr in 1e-4 3e-4; do rredcot train train.lr=$lr run.tag=lr$lr; done"
            )
        if ov.is_delete():
            raise ConfigError(f"'{text}': deleting keys is not supported; set a value instead")
        if key == "method.name":
            raise ConfigError(f"'{text}': choose the method with method=NAME, not method.name")
        if key.startswith("method."):
            method_overrides.append((text.lstrip("+"), ov))
            continue
        if key in groups and ov.package is None:
            value = ov.value()
            if ov.is_add() and key in _OPTIONAL_GROUPS:
                text = text.lstrip("+")  # +experiment=x means experiment=x here
            if isinstance(value, str) and value not in groups[key]:
                raise unknown_option(key, value, config_dirs)
        hydra_overrides.append(text)
    return hydra_overrides, method_overrides


def _hydra_compose(overrides: list[str], config_dirs: Sequence[str | Path] = ()) -> DictConfig:
    """Compose config.yaml with Hydra's Compose API (outside any Hydra app state).

    The search path is Hydra's own configs, the user's config folders (``user_config_dirs``),
    the packaged CONF_DIR, then the ConfigStore, where the schema lives and where a plugin's
    method or benchmark without a YAML file gets the node ``{name: NAME}``. Hydra's public
    ``initialize_config_dir`` takes one folder and ``hydra.searchpath`` appends after it, so the
    search path is built with Hydra's own helpers (pinned to hydra-core 1.3)."""
    # deferred: --help
    import yaml
    from hydra import compose as hydra_compose
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rredcot_cli.config.schema import Config

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=Config)
    for group in ("method", "benchmark"):
        for name in plugin_options(group):
            if config_file(group, name, config_dirs) is None:
                store.store(group=group, name=name, node={"name": name})
    search_path = create_config_search_path(None)
    search_path.prepend("main", f"file://{CONF_DIR}", anchor=SearchPathQuery(provider="schema"))
    for folder in user_config_dirs(config_dirs):
        search_path.prepend("rredcot-user", f"file://{folder}", anchor=SearchPathQuery(provider="main"))
    global_hydra = GlobalHydra.instance()
    previous = global_hydra.hydra  # e.g. inside a @hydra.main sweep entry point
    global_hydra.clear()
    try:
        version.setbase("1.3")
        Hydra.create_main_hydra2(task_name="rredcot", config_search_path=search_path)
        return hydra_compose(config_name=CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise translate(e, overrides, config_dirs) from e
    except yaml.YAMLError as e:
        raise yaml_error(e) from e
    finally:
        GlobalHydra.instance().hydra = previous


def _check_against_schema(container: dict, tp: Any, prefix: str = "") -> None:
    """Refuse keys the schema does not declare (e.g. added with +) and keys that were removed."""
    fields = schema_fields(tp) or {}
    for key in container:
        if key not in fields:
            parent = prefix.rstrip(".")
            raise unknown_key(f"{prefix}{key}", list(fields), parent)
    for key, field_type in fields.items():
        if key not in container:
            raise ConfigError(f"key '{prefix}{key}' is missing from the config")
        if schema_fields(field_type) is not None and isinstance(container[key], dict):
            _check_against_schema(container[key], field_type, f"{prefix}{key}.")


def _check_inputs(inputs: Any) -> None:
    from rredcot_cli.store.artifacts import ARTIFACTS  # deferred: --help

    if not isinstance(inputs, dict):
        raise ConfigError(f"inputs must be a group of paths (inputs.samples=PATH, ...), not {inputs!r}")
    for key, value in inputs.items():
        if key not in ARTIFACTS:
            raise unknown_key(f"inputs.{key}", list(ARTIFACTS), "inputs")
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"inputs.{key}={value}: expected a path (a string)")


def _resolve_method(cfg: DictConfig, method_overrides: list[tuple[str, Any]],
                    config_dirs: Sequence[str | Path] = ()) -> None:
    """Check ``cfg.method`` against the chosen method's declared parameters, filling defaults.

    Replaces ``cfg.method`` with ``{name, **params}`` where params are the method's dataclass
    defaults merged with the YAML values and the ``method.*`` overrides.
    """
    # deferred: --help
    from omegaconf import OmegaConf
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    from rredcot_cli.methods import get_method, method_names

    node = OmegaConf.to_container(cfg.method, resolve=False) if cfg.method is not None else None
    if not isinstance(node, dict) or not node.get("name"):
        valid = ", ".join(group_options(config_dirs).get("method", []))
        raise ConfigError(f"no method chosen; pass method=NAME (valid methods: {valid})")
    name = node.pop("name")
    try:
        spec = get_method(name)
    except KeyError:
        raise ConfigError(
            f"method '{name}' has a config but no registered implementation "
            f"(registered methods: {', '.join(method_names())})"
        ) from None

    valid_keys = spec.param_names()
    hints = typing.get_type_hints(spec.params)

    def fail(exc: OmegaConfBaseException, key: str, text: str | None) -> ConfigError:
        key = getattr(exc, "full_key", None) or key
        if isinstance(exc, ValidationError):
            expected = describe_type(hints[key]) if key in hints else "another type"
            return wrong_type(f"method.{key}", expected, str(exc), [text] if text else [])
        if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
            if not valid_keys:
                return ConfigError(f"unknown key 'method.{key}': method '{name}' takes no parameters")
            return unknown_key(f"method.{key}", valid_keys, "method", f" for method '{name}'")
        return ConfigError(f"method.{key}: {one_line(exc)}")

    params = OmegaConf.structured(spec.plain_params())  # its choices are checked after resolving
    OmegaConf.set_struct(params, True)
    for key, value in node.items():
        try:
            OmegaConf.update(params, key, value, merge=True)
        except OmegaConfBaseException as e:
            raise fail(e, key, None) from e
    for text, ov in method_overrides:
        key = ov.key_or_group[len("method."):]
        try:
            OmegaConf.update(params, key, ov.value(), merge=True)
        except OmegaConfBaseException as e:
            raise fail(e, key, text) from e
    # Not OmegaConf.missing_keys: it resolves interpolations, and a method's config may read other
    # groups (rredcot's value: ${model.value_estimator}), which these params alone do not hold.
    missing = sorted(key for key in params.keys() if OmegaConf.is_missing(params, key))
    if missing:
        needed = " ".join(f"method.{k}=VALUE" for k in missing)
        raise ConfigError(f"method '{name}' needs {needed}")
    values = OmegaConf.to_container(params, resolve=False, enum_to_str=True)
    cfg.method = {"name": name, **values}


def _unresolvable_key(cfg: DictConfig, container: Any, prefix: str = "") -> str | None:
    """The first key whose interpolation (``${...}``) fails to resolve, for error messages."""
    from omegaconf import OmegaConf  # deferred: --help

    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            found = _unresolvable_key(cfg, value, f"{path}.")
            if found:
                return found
        elif isinstance(value, str) and "${" in value:
            try:
                OmegaConf.select(cfg, path, throw_on_resolution_failure=True)
            except Exception:  # noqa: BLE001 - any failure marks the culprit
                return path
    return None


def _import_plugins(specs: Any) -> None:
    from rredcot_cli import benchmarks, methods  # deferred: --help

    registries = {"method": methods.registered_names, "benchmark": benchmarks.registered_names}

    if isinstance(specs, str) or not isinstance(specs, (list, tuple)):
        raise ConfigError(f"plugins={specs}: expected a list of modules or .py files, e.g. plugins=[my_pkg.credit]")
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"plugins: {spec!r} is not a module name or a .py file")
        import_plugin(spec.strip(), registries)


def _command_line_plugins(overrides: Sequence[str]) -> None:
    """Import the ``plugins=[...]`` given on the command line before the overrides are checked,
    so the methods and benchmarks they register are options of ``method=``/``benchmark=``."""
    # deferred: --help
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    for text in overrides:
        if text.lstrip("+").split("=", 1)[0].strip() != "plugins":
            continue
        try:
            value = OverridesParser.create().parse_overrides([text])[0].value()
        except OverrideParseException as e:
            raise parse_error(str(e)) from e
        _import_plugins(value)


def compose(overrides: Sequence[str] = (), config_dirs: Sequence[str | Path] = ()) -> DictConfig:
    """The resolved, read-only config for ``overrides`` (Hydra override syntax).

    ``config_dirs``: the user's config folders, searched before ``$RREDCOT_CONFIG_PATH`` and the
    packaged tree (``search_dirs``). Steps: import the ``plugins=`` named on the command line;
    check and split the overrides; compose ``config.yaml`` + groups + experiment with
    Hydra; refuse keys outside the schema; check ``inputs``; import ``plugins`` (those set in
    YAML files too); check the method's parameters
    against its registry entry (this imports the method registry, hence torch); resolve
    interpolations (``run.dir`` defaults to ``runs/<YYYYmmdd-HHMMSS>``, from the ``now``
    resolver); check every numeric option against its range, every option declared with choices
    (``schema.one_of``) and every method option typed ``Literal[...]`` against them, and each
    group's cross-checks (``TrainConfig.problems``), all in ``check_ranges``. Raises
    ``ConfigError`` with a one-line message on any mistake.
    """
    # deferred: --help
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rredcot_cli.config.schema import Config

    overrides = list(overrides)
    _command_line_plugins(overrides)
    hydra_overrides, method_overrides = _parse_overrides(overrides, config_dirs)
    cfg = _hydra_compose(hydra_overrides, config_dirs)
    if not OmegaConf.has_resolver("now"):  # Hydra registers it; keep working if it stops doing so

        OmegaConf.register_new_resolver(
            "now", lambda pattern: datetime.now().strftime(pattern), use_cache=True
        )
    container = OmegaConf.to_container(cfg, resolve=False)
    _check_against_schema(container, Config)
    _check_inputs(container["inputs"])
    _import_plugins(container["plugins"])
    _resolve_method(cfg, method_overrides, config_dirs)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        key = _unresolvable_key(cfg, OmegaConf.to_container(cfg, resolve=False)) or "the config"
        raise ConfigError(f"cannot resolve {key}: {one_line(str(e).splitlines()[0])}") from e
    check_ranges(cfg)
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    return cfg
