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

Overrides follow Hydra: ``group=option``, ``key=value``, ``+key=value`` (add), ``experiment=NAME``
(also accepted as ``+experiment=NAME``). ``method.<param>=value`` may set any parameter the
chosen method declares, whether or not its YAML lists it.

Nothing here imports Hydra, OmegaConf, yaml, the schema, the registries or torch at import time:
the CLI imports this module to list the config groups in ``rredcot --help``, so they are imported
inside the functions that use them.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import math
import os
import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rredcot_cli.errors import RredcotError, one_line

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONF_MODULE = "rredcot_cli.conf"


def _packaged_conf_dir() -> Path:
    """The packaged config tree: the repository's top-level ``conf/``, installed as the package
    ``rredcot_cli.conf`` (pyproject's package-dir), so a wheel and an editable install both find
    it; a source checkout used without installing (``PYTHONPATH=.``) falls back to ``../conf``.
    Only the import machinery is asked (``find_spec``): ``conf/__init__.py`` is not run."""
    try:
        spec = importlib.util.find_spec(CONF_MODULE)
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(__file__).resolve().parents[2] / "conf"


CONF_DIR = _packaged_conf_dir()
CONFIG_NAME = "config"
SCHEMA_NAME = "rredcot_schema"  # the ConfigStore entry config.yaml extends
_OPTIONAL_GROUPS = ("experiment",)  # groups whose default is "none"
# User config folders searched before CONF_DIR, separated like PATH; `--config-dir DIR` prepends.
CONFIG_PATH_ENV = "RREDCOT_CONFIG_PATH"


class ConfigError(RredcotError):
    """The command line does not describe a valid config; the message is one line."""


# --------------------------------------------------------------------------- search path


def user_config_dirs(config_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """The user's config folders, searched before the packaged tree: ``config_dirs`` first, then
    the entries of ``$RREDCOT_CONFIG_PATH`` (``os.pathsep``-separated), as absolute paths without
    repeats. Each holds group folders like the packaged one (``experiment/mine.yaml``, ...)."""
    entries = [str(d) for d in config_dirs]
    entries += [e for e in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if e.strip()]
    found: list[Path] = []
    for entry in entries:
        folder = Path(entry).expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(f"config dir {entry}: no such folder (given by --config-dir or {CONFIG_PATH_ENV})")
        if folder not in found and folder != CONF_DIR:
            found.append(folder)
    return found


def search_dirs(config_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """Where config files are looked up, first match wins: the user's folders, then CONF_DIR."""
    return [*user_config_dirs(config_dirs), CONF_DIR]


def config_file(group: str, option: str, config_dirs: Sequence[str | Path] = ()) -> Path | None:
    """The YAML file that ``group=option`` composes (the first on the search path), or None."""
    for folder in search_dirs(config_dirs):
        candidate = folder / group / f"{option}.yaml"
        if candidate.is_file():
            return candidate
    return None


# --------------------------------------------------------------------------- groups


def group_options(config_dirs: Sequence[str | Path] = ()) -> dict[str, list[str]]:
    """Each config group (a folder of the packaged ``conf/``) and its options, sorted: the YAML
    files of that folder in the packaged tree and in the user's config folders, plus the credit
    methods and benchmarks of plugins (entry points, ``plugins=``), which need no YAML file."""
    from rredcot_cli.plugins import plugin_options

    dirs = search_dirs(config_dirs)
    groups: dict[str, list[str]] = {}
    for folder in sorted(CONF_DIR.iterdir()):
        if folder.is_dir() and not folder.name.startswith(("_", ".")):
            names = set(plugin_options(folder.name))
            for root in dirs:
                names |= {p.stem for p in (root / folder.name).glob("*.yaml")}
            groups[folder.name] = sorted(names)
    return groups


def default_options(config_dirs: Sequence[str | Path] = ()) -> dict[str, str | None]:
    """The option each group gets when none is chosen (from config.yaml's defaults list)."""
    import yaml

    primary = next(d / f"{CONFIG_NAME}.yaml" for d in search_dirs(config_dirs) if (d / f"{CONFIG_NAME}.yaml").is_file())
    defaults = yaml.safe_load(primary.read_text()).get("defaults", [])
    chosen: dict[str, str | None] = {}
    for entry in defaults:
        if isinstance(entry, dict):
            for key, value in entry.items():
                chosen[key.replace("optional ", "").strip()] = value
    return chosen


def _plural(group: str) -> str:
    return group if group.endswith("s") else f"{group}s"


def _unknown_option(group: str, option: object, config_dirs: Sequence[str | Path] = ()) -> ConfigError:
    valid = group_options(config_dirs).get(group, [])
    close = difflib.get_close_matches(str(option), valid, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    sep = " Valid" if close else "; valid"
    return ConfigError(
        f"unknown option '{group}={option}'{hint}{sep} {_plural(group)}: {', '.join(valid)}"
    )


# --------------------------------------------------------------------------- schema helpers


def _schema_fields(tp: Any) -> dict[str, Any] | None:
    """Field name -> type of a dataclass (None if ``tp`` is not one)."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    return typing.get_type_hints(tp)


def _schema_type(dotted: str, root: Any = None) -> Any:
    """The declared type of ``dotted`` (e.g. "train.steps") in the schema, or None if unknown."""
    from rredcot_cli.config.schema import Config

    tp = Config if root is None else root
    for part in dotted.split(".") if dotted else []:
        fields = _schema_fields(tp)
        if fields is None or part not in fields:
            return None
        tp = fields[part]
    return tp


def _describe_type(tp: Any) -> str:
    """'an int', 'a float', 'a list of floats', 'a string or null', ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(_describe_type(a) for a in rest)
        return f"{text} or null" if len(rest) < len(args) else text
    if origin in (list, typing.List, tuple):
        inner = _describe_type(args[0]) if args else "a value"
        inner = inner.split(" ", 1)[-1].split(" (")[0]
        return f"a list of {inner}s"
    names = {int: "an int", float: "a float", bool: "a bool (true/false)", str: "a string"}
    if tp in names:
        return names[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "a group of keys"
    return getattr(tp, "__name__", str(tp))


def _valid_keys(parent: str) -> list[str]:
    """The keys allowed directly under ``parent`` ("" for the top level)."""
    if parent == "inputs":
        from rredcot_cli.store.artifacts import ARTIFACTS

        return list(ARTIFACTS)
    return list(_schema_fields(_schema_type(parent)) or {})


def _unknown_key(full_key: str, valid: Sequence[str], parent: str, context: str = "") -> ConfigError:
    leaf = full_key.rsplit(".", 1)[-1]
    prefix = f"{parent}." if parent else ""
    close = difflib.get_close_matches(leaf, list(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    where = f"under {parent}" if parent else "at the top level"
    return ConfigError(
        f"unknown key '{full_key}'{context}{hint}"
        f"{' Valid' if close else '; valid'} keys {where}: {', '.join(valid)}"
    )


def _override_for(key: str, overrides: Sequence[str]) -> str | None:
    """The override text that sets ``key`` (with or without + / ++), if any."""
    for text in overrides:
        if text.lstrip("+").split("=", 1)[0] == key:
            return text.lstrip("+")
    return None


def _wrong_type(full_key: str, expected: str, message: str, overrides: Sequence[str]) -> ConfigError:
    text = _override_for(full_key, overrides)
    if text is None:
        got = re.search(r"Value '(.*?)' ", message)
        text = f"{full_key}={got.group(1)}" if got else full_key
    not_optional = "is not Optional" in message
    return ConfigError(f"{text}: expected {expected}{', not null' if not_optional else ''}")


# --------------------------------------------------------------------------- errors


def _exception_chain(e: BaseException) -> list[BaseException]:
    chain = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _translate(e: BaseException, overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()) -> ConfigError:
    """A one-line ``ConfigError`` for an exception raised while Hydra composed the config; an
    error inside a config file (Hydra says "In 'group/option'") starts with that file's path."""
    chain = _exception_chain(e)
    error = _translate_chain(chain, overrides, config_dirs)
    for exc in chain:
        found = re.match(r"In '([^']+)'", str(exc))
        if found:
            group, _, option = found.group(1).rpartition("/")
            path = config_file(group, option, config_dirs) if group else None
            if path is None and not group:
                path = next((d / f"{option}.yaml" for d in search_dirs(config_dirs)
                             if (d / f"{option}.yaml").is_file()), None)
            if path is not None:
                return ConfigError(f"{path}: {error}")
    return error


def _yaml_error(e: Exception) -> ConfigError:
    """A YAML syntax error in a config file: the file, line and column, and the problem."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or one_line(e)
    if mark is None:
        return ConfigError(f"cannot read a config file: {one_line(e)}")
    context, where = getattr(e, "context", None), getattr(e, "context_mark", None)
    started = f", {context} from line {where.line + 1}" if context and where is not None and where is not mark else ""
    return ConfigError(f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}: {problem}{started} (not valid YAML)")


def _translate_chain(chain: list[BaseException], overrides: Sequence[str], config_dirs: Sequence[str | Path]) -> ConfigError:
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigKeyError, ConfigAttributeError, ValidationError

    for exc in chain:
        if isinstance(exc, MissingConfigException):
            found = re.search(r"Could not find '([^'/]+)/([^']+)'", str(exc))
            if found:
                return _unknown_option(found.group(1), found.group(2), config_dirs)
        if isinstance(exc, OverrideParseException):
            return _parse_error(str(exc))
        full_key = getattr(exc, "full_key", None)
        if isinstance(exc, ValidationError) and full_key:
            expected = _schema_type(full_key)
            described = _describe_type(expected) if expected is not None else "another type"
            return _wrong_type(full_key, described, str(exc), overrides)
        if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) and full_key:
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            if typing.get_origin(_schema_type(parent)) in (dict, typing.Dict):
                return ConfigError(f"'{full_key}' is a new key of {parent}; add it with +{full_key}=VALUE")
            return _unknown_key(full_key, _valid_keys(parent), parent)
    return ConfigError(one_line(str(chain[0]).split("\nConfig search path")[0]))


def _parse_error(message: str) -> ConfigError:
    found = re.search(r"Error parsing override '(.*?)'\n(.*?)\n", message + "\n")
    if found:
        return ConfigError(
            f"cannot parse override '{found.group(1)}' ({found.group(2)}); "
            "use group=option, key=value or +key=value"
        )
    return ConfigError(one_line(message))


# --------------------------------------------------------------------------- compose


def _parse_overrides(overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()) -> tuple[list[str], list[tuple[str, Any]]]:
    """Check the overrides and split them: (overrides for Hydra, ``method.*`` overrides).

    ``method.<param>=v`` overrides are applied after the method's parameters are known.
    """
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
            raise _parse_error(str(e)) from e
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
                raise _unknown_option(key, value, config_dirs)
        hydra_overrides.append(text)
    return hydra_overrides, method_overrides


def _hydra_compose(overrides: list[str], config_dirs: Sequence[str | Path] = ()) -> DictConfig:
    """Compose config.yaml with Hydra's Compose API (outside any Hydra app state).

    The search path is Hydra's own configs, the user's config folders (``user_config_dirs``),
    the packaged CONF_DIR, then the ConfigStore, where the schema lives and where a plugin's
    method or benchmark without a YAML file gets the node ``{name: NAME}``. Hydra's public
    ``initialize_config_dir`` takes one folder and ``hydra.searchpath`` appends after it, so the
    search path is built with Hydra's own helpers (pinned to hydra-core 1.3)."""
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

    from rredcot_cli.plugins import plugin_options
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
        raise _translate(e, overrides, config_dirs) from e
    except yaml.YAMLError as e:
        raise _yaml_error(e) from e
    finally:
        GlobalHydra.instance().hydra = previous


def _check_against_schema(container: dict, tp: Any, prefix: str = "") -> None:
    """Refuse keys the schema does not declare (e.g. added with +) and keys that were removed."""
    fields = _schema_fields(tp) or {}
    for key in container:
        if key not in fields:
            parent = prefix.rstrip(".")
            raise _unknown_key(f"{prefix}{key}", list(fields), parent)
    for key, field_type in fields.items():
        if key not in container:
            raise ConfigError(f"key '{prefix}{key}' is missing from the config")
        if _schema_fields(field_type) is not None and isinstance(container[key], dict):
            _check_against_schema(container[key], field_type, f"{prefix}{key}.")


def _check_inputs(inputs: Any) -> None:
    from rredcot_cli.store.artifacts import ARTIFACTS

    if not isinstance(inputs, dict):
        raise ConfigError(f"inputs must be a group of paths (inputs.samples=PATH, ...), not {inputs!r}")
    for key, value in inputs.items():
        if key not in ARTIFACTS:
            raise _unknown_key(f"inputs.{key}", list(ARTIFACTS), "inputs")
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"inputs.{key}={value}: expected a path (a string)")


def _resolve_method(cfg: DictConfig, method_overrides: list[tuple[str, Any]],
                    config_dirs: Sequence[str | Path] = ()) -> None:
    """Check ``cfg.method`` against the chosen method's declared parameters, filling defaults.

    Replaces ``cfg.method`` with ``{name, **params}`` where params are the method's dataclass
    defaults merged with the YAML values and the ``method.*`` overrides.
    """
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
            expected = _describe_type(hints[key]) if key in hints else "another type"
            return _wrong_type(f"method.{key}", expected, str(exc), [text] if text else [])
        if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
            if not valid_keys:
                return ConfigError(f"unknown key 'method.{key}': method '{name}' takes no parameters")
            return _unknown_key(f"method.{key}", valid_keys, "method", f" for method '{name}'")
        return ConfigError(f"method.{key}: {one_line(exc)}")

    params = OmegaConf.structured(spec.params)
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
    missing = sorted(OmegaConf.missing_keys(params))
    if missing:
        needed = " ".join(f"method.{k}=VALUE" for k in missing)
        raise ConfigError(f"method '{name}' needs {needed}")
    values = OmegaConf.to_container(params, resolve=False, enum_to_str=True)
    cfg.method = {"name": name, **values}


# --------------------------------------------------------------------------- ranges


@dataclasses.dataclass(frozen=True)
class Range:
    """A parsed range spec (``rredcot_cli.config.schema.RANGES``): bounds are numbers or option names."""

    low: float | str | None
    high: float | str | None
    low_open: bool
    high_open: bool
    note: str
    text: str  # "> 0", "in [0, 1)", ... as the message shows it


_BOUND = r"(-?inf|[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|[A-Za-z_][\w.]*)"


def _bound(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def parse_range(spec: str) -> Range:
    """``">= 1"``, ``"> 0"``, ``"<= 1"``, ``"< 1"`` or ``"[0, 1)"`` (bounds may name options),
    optionally followed by ``"; note"``. Raises ``ValueError`` for anything else (a bug in a table)."""
    body, _, note = spec.partition(";")
    body, note = body.strip(), note.strip()
    found = re.fullmatch(rf"(>=|>|<=|<)\s*{_BOUND}", body)
    if found:
        op, value = found.group(1), _bound(found.group(2))
        if op.startswith(">"):
            return Range(value, None, op == ">", False, note, body)
        return Range(None, value, False, op == "<", note, body)
    found = re.fullmatch(rf"([\[(])\s*{_BOUND}\s*,\s*{_BOUND}\s*([\])])", body)
    if found:
        low, high = _bound(found.group(2)), _bound(found.group(3))
        return Range(low, high, found.group(1) == "(", found.group(4) == ")", note, f"in {body}")
    raise ValueError(f"not a range spec: {spec!r}")


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def range_error(key: str, value: Any, spec: str, lookup: Any) -> str | None:
    """The one-line complaint about ``key=value`` outside ``spec``, or None when it is inside.

    ``lookup(name)`` gives the value of an option a bound names. A list value is checked entry by
    entry; null and non-numbers (a type error is Hydra's to report) pass."""
    rng = parse_range(spec)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    named = {}
    bounds = []
    for bound in (rng.low, rng.high):
        if isinstance(bound, str):  # another option's value
            named[bound] = lookup(bound)
            bound = named[bound]
        bounds.append(float(bound) if _is_number(bound) else None)
    low, high = bounds
    for v in values:
        if not _is_number(v):
            continue
        if math.isnan(v) or (low is not None and (v < low or (rng.low_open and v == low))) or \
                (high is not None and (v > high or (rng.high_open and v == high))):
            break
    else:
        return None
    each = "each entry " if isinstance(value, (list, tuple)) else ""
    extra = [f"{name}={_show(v)}" for name, v in named.items()]
    if rng.note:
        extra.append(rng.note)
    detail = f" ({'; '.join(extra)})" if extra else ""
    return f"{key}={_show(value)}: {each}must be {rng.text}{detail}"


def check_ranges(cfg: DictConfig) -> None:
    """Refuse a numeric option outside its range (``schema.RANGES``, ``schema.DIVISIBLE_BY``) and
    a method parameter outside the range its registry entry declares: one ``ConfigError`` line."""
    from omegaconf import OmegaConf

    from rredcot_cli.config.schema import DIVISIBLE_BY, RANGES

    def lookup(key: str) -> Any:
        return OmegaConf.select(cfg, key)

    for key, spec in RANGES.items():
        value = lookup(key)
        if OmegaConf.is_list(value):
            value = OmegaConf.to_container(value)
        problem = range_error(key, value, spec, lookup)
        if problem:
            raise ConfigError(problem)
    for key, divisor_key in DIVISIBLE_BY:
        value, divisor = lookup(key), lookup(divisor_key)
        if _is_number(value) and _is_number(divisor) and divisor and value % divisor:
            raise ConfigError(f"{key}={value}: must be a multiple of {divisor_key}={divisor}")
    if cfg.method is not None and cfg.method.get("name"):
        check_method_ranges(cfg.method.name, OmegaConf.to_container(cfg.method, resolve=True), "method.")


def check_method_ranges(name: str, params: dict, prefix: str) -> None:
    """Refuse a parameter of method ``name`` outside its declared range; ``prefix`` is how the
    message names it (``method.`` or ``judge.params.<name>.``)."""
    from rredcot_cli.methods import get_method

    try:
        ranges = get_method(name).ranges
    except KeyError:
        return
    for key, spec in ranges.items():
        body, sep, note = spec.partition(";")
        for other in params:  # a bound naming another parameter, shown as the user writes it
            body = re.sub(rf"(?<![\w.]){re.escape(other)}\b", f"{prefix}{other}", body)
        problem = range_error(f"{prefix}{key}", params.get(key), body + sep + note,
                              lambda name: params.get(name.removeprefix(prefix)))
        if problem:
            raise ConfigError(problem)


def _unresolvable_key(cfg: DictConfig, container: Any, prefix: str = "") -> str | None:
    """The first key whose interpolation (``${...}``) fails to resolve, for error messages."""
    from omegaconf import OmegaConf

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
    from rredcot_cli import benchmarks, methods
    from rredcot_cli.plugins import import_plugin

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
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    for text in overrides:
        if text.lstrip("+").split("=", 1)[0].strip() != "plugins":
            continue
        try:
            value = OverridesParser.create().parse_overrides([text])[0].value()
        except OverrideParseException as e:
            raise _parse_error(str(e)) from e
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
    resolver); check every numeric option against its range (``check_ranges``). Raises
    ``ConfigError`` with a one-line message on any mistake.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rredcot_cli.config.schema import Config

    overrides = list(overrides)
    _command_line_plugins(overrides)
    hydra_overrides, method_overrides = _parse_overrides(overrides, config_dirs)
    cfg = _hydra_compose(hydra_overrides, config_dirs)
    if not OmegaConf.has_resolver("now"):  # Hydra registers it; keep working if it stops doing so
        from datetime import datetime

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


def config_hash(cfg: DictConfig, keys: Sequence[str]) -> str:
    """First 12 hex chars of the sha256 of the resolved, key-sorted YAML of ``cfg[keys]``.

    Stable across processes and across the order of ``keys``; ``run`` should never be among
    ``keys`` (``run.dir`` differs between runs).
    """
    import yaml
    from omegaconf import OmegaConf

    missing = [k for k in keys if k not in cfg]
    if missing:
        raise KeyError(f"config_hash: no top-level key(s) {', '.join(missing)} in the config")
    selected = OmegaConf.masked_copy(cfg, sorted(set(keys)))
    data = OmegaConf.to_container(selected, resolve=True, enum_to_str=True)
    text = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
