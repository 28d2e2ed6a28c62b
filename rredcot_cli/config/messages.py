"""One-line ``ConfigError`` messages for what goes wrong while a config is composed: an unknown
group option or key (with the closest valid one), a value of the wrong type (named as the schema
declares it), a YAML syntax error, an override Hydra cannot parse, and the translation of Hydra's
and OmegaConf's exceptions into one of these.

``config.compose`` imports this module, and the CLI imports that for ``rredcot --help``: Hydra,
OmegaConf and the schema are imported inside the functions that use them (marked "deferred").
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Sequence

from rredcot_cli.config.search import config_file, group_options, search_dirs
from rredcot_cli.errors import ConfigError, one_line

def _plural(group: str) -> str:
    return group if group.endswith("s") else f"{group}s"


def closest(word: str, valid: Sequence[str], cutoff: float = 0.6) -> str | None:
    """The valid name closest to ``word`` by spelling, case ignored (``RREDCoT`` -> ``rredcot``,
    as the paper spells it), or None when none is close."""
    by_lower = {v.lower(): v for v in reversed(list(valid))}  # the first of names equal but for case
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def unknown_option(group: str, option: object, config_dirs: Sequence[str | Path] = ()) -> ConfigError:
    valid = group_options(config_dirs).get(group, [])
    near = closest(str(option), valid)
    hint = f"; did you mean {near}?" if near else ""
    sep = " Valid" if near else "; valid"
    return ConfigError(
        f"unknown option '{group}={option}'{hint}{sep} {_plural(group)}: {', '.join(valid)}"
    )


def schema_fields(tp: Any) -> dict[str, Any] | None:
    """Field name -> type of a dataclass (None if ``tp`` is not one)."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    return typing.get_type_hints(tp)


def schema_type(dotted: str, root: Any = None) -> Any:
    """The declared type of ``dotted`` (e.g. "train.steps") in the schema, or None if unknown."""
    from rredcot_cli.config.schema import Config  # deferred: --help

    tp = Config if root is None else root
    for part in dotted.split(".") if dotted else []:
        fields = schema_fields(tp)
        if fields is None or part not in fields:
            return None
        tp = fields[part]
    return tp


def describe_type(tp: Any) -> str:
    """'an int', 'a float', 'a list of floats', 'a string or null', ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(describe_type(a) for a in rest)
        return f"{text} or null" if len(rest) < len(args) else text
    if origin in (list, typing.List, tuple):
        inner = describe_type(args[0]) if args else "a value"
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
        from rredcot_cli.store.artifacts import ARTIFACTS  # deferred: --help

        return list(ARTIFACTS)
    return list(schema_fields(schema_type(parent)) or {})


def unknown_key(full_key: str, valid: Sequence[str], parent: str, context: str = "") -> ConfigError:
    leaf = full_key.rsplit(".", 1)[-1]
    prefix = f"{parent}." if parent else ""
    near = closest(leaf, list(valid))
    hint = f"; did you mean {prefix}{near}?" if near else ""
    where = f"under {parent}" if parent else "at the top level"
    return ConfigError(
        f"unknown key '{full_key}'{context}{hint}"
        f"{' Valid' if near else '; valid'} keys {where}: {', '.join(valid)}"
    )


def _override_for(key: str, overrides: Sequence[str]) -> str | None:
    """The override text that sets ``key`` (with or without + / ++), if any."""
    for text in overrides:
        if text.lstrip("+").split("=", 1)[0] == key:
            return text.lstrip("+")
    return None


def wrong_type(full_key: str, expected: str, message: str, overrides: Sequence[str]) -> ConfigError:
    text = _override_for(full_key, overrides)
    if text is None:
        got = re.search(r"Value '(.*?)' ", message)
        text = f"{full_key}={got.group(1)}" if got else full_key
    not_optional = "is not Optional" in message
    return ConfigError(f"{text}: expected {expected}{', not null' if not_optional else ''}")


def _exception_chain(e: BaseException) -> list[BaseException]:
    chain = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def translate(e: BaseException, overrides: Sequence[str], config_dirs: Sequence[str | Path] = ()) -> ConfigError:
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


def yaml_error(e: Exception) -> ConfigError:
    """A YAML syntax error in a config file: the file, line and column, and the problem."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or one_line(e)
    if mark is None:
        return ConfigError(f"cannot read a config file: {one_line(e)}")
    context, where = getattr(e, "context", None), getattr(e, "context_mark", None)
    started = f", {context} from line {where.line + 1}" if context and where is not None and where is not mark else ""
    return ConfigError(f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}: {problem}{started} (not valid YAML)")


def _translate_chain(chain: list[BaseException], overrides: Sequence[str], config_dirs: Sequence[str | Path]) -> ConfigError:
    # deferred: --help
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigKeyError, ConfigAttributeError, ValidationError

    for exc in chain:
        if isinstance(exc, MissingConfigException):
            found = re.search(r"Could not find '([^'/]+)/([^']+)'", str(exc))
            if found:
                return unknown_option(found.group(1), found.group(2), config_dirs)
        if isinstance(exc, OverrideParseException):
            return parse_error(str(exc))
        full_key = getattr(exc, "full_key", None)
        if isinstance(exc, ValidationError) and full_key:
            expected = schema_type(full_key)
            described = describe_type(expected) if expected is not None else "another type"
            return wrong_type(full_key, described, str(exc), overrides)
        if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) and full_key:
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            if typing.get_origin(schema_type(parent)) in (dict, typing.Dict):
                return ConfigError(f"'{full_key}' is a new key of {parent}; add it with +{full_key}=VALUE")
            return unknown_key(full_key, _valid_keys(parent), parent)
    return ConfigError(one_line(str(chain[0]).split("\nConfig search path")[0]))


def parse_error(message: str) -> ConfigError:
    found = re.search(r"Error parsing override '(.*?)'\n(.*?)\n", message + "\n")
    if found:
        return ConfigError(
            f"cannot parse override '{found.group(1)}' ({found.group(2)}); "
            "use group=option, key=value or +key=value"
        )
    return ConfigError(one_line(message))
