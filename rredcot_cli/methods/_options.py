"""A method's options, read from its params dataclass: the one description of them that the
compose-time checks (``config.ranges``), ``rredcot list methods NAME`` and a generated docs
reference all use.

The dataclass says everything once:

- the choices of an option in its type: ``value: Literal["suffix_is", "answer_probe"] = "suffix_is"``
  (``Optional[Literal[...]]`` also allows null);
- its meaning in a comment: the comment at the end of the field's line, after the comment lines
  right above it (the house's way of documenting a field, so no help text repeats it);
- its range in the method's registry entry (``register(..., ranges={"eps": "> 0"})``).

OmegaConf, which types ``method.*`` while the config is composed, rejects ``Literal``:
``plain_params`` gives the same dataclass with each ``Literal`` typed by its values (``str``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any, Literal, Union


@dataclasses.dataclass(frozen=True)
class MethodOption:
    """One hyper-parameter of a method (``method.<name>=value``)."""

    name: str
    type: str  # as a user reads it: "float", "one of: immediate, reward_to_go, mixed", ...
    choices: tuple[Any, ...] | None  # the Literal's values; None if any value of the type goes
    default: Any  # dataclasses.MISSING when the option must be set
    range: str | None  # the registry's range spec ("> 0", "[0, 1)"), or None
    help: str  # the field's comment; "" when it has none


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` type (also inside ``Optional``), or None for any other type."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) is Union:
        for arg in typing.get_args(tp):
            found = literal_choices(arg)
            if found is not None:
                return found
    return None


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) is Union and type(None) in typing.get_args(tp)


def choices(params: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> allowed values, for every ``Literal`` field of the dataclass ``params``
    (None among them when the field is ``Optional``)."""
    found = {}
    for name, tp in typing.get_type_hints(params).items():
        values = literal_choices(tp)
        if values is not None:
            found[name] = values + ((None,) if _allows_none(tp) else ())
    return found


def describe(tp: Any) -> str:
    """A field's type as ``rredcot list methods NAME`` shows it."""
    values = literal_choices(tp)
    if values is not None:
        text = "one of: " + ", ".join(map(str, values))
        return f"{text} (or null)" if _allows_none(tp) else text
    if typing.get_origin(tp) is Union:
        rest = [describe(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(rest) + (" or null" if _allows_none(tp) else "")
    if typing.get_origin(tp) in (list, typing.List):
        inner = typing.get_args(tp)
        return f"list of {describe(inner[0])}" if inner else "list"
    return getattr(tp, "__name__", str(tp))


@functools.lru_cache(maxsize=None)
def field_comments(params: type) -> dict[str, str]:
    """Field name -> its comment in the source of the dataclass ``params``: the comment lines right
    above the field, then the comment at the end of its line. {} when the source cannot be read
    (a class made at run time)."""
    try:
        source = textwrap.dedent(inspect.getsource(params))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        k = node.lineno - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, comments[k])
            k -= 1
        trailing = [comments[k] for k in range(node.lineno, node.end_lineno + 1) if k in comments]
        found[node.target.id] = "; ".join(part for part in (" ".join(above), " ".join(trailing)) if part)
    return found


def options(params: type, ranges: dict[str, str]) -> list[MethodOption]:
    """Every field of the dataclass ``params`` as a ``MethodOption``, in declaration order."""
    hints = typing.get_type_hints(params)
    comments = field_comments(params)
    found = []
    for f in dataclasses.fields(params):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        found.append(MethodOption(name=f.name, type=describe(hints[f.name]), choices=literal_choices(hints[f.name]),
                                  default=default, range=ranges.get(f.name), help=comments.get(f.name, "")))
    return found


def _plain(tp: Any) -> Any:
    """``tp`` with each ``Literal[...]`` replaced by the type of its values (OmegaConf's types)."""
    values = literal_choices(tp)
    if values is None:
        return tp
    kinds = {type(v) for v in values}
    plain = kinds.pop() if len(kinds) == 1 else Any
    return typing.Optional[plain] if _allows_none(tp) else plain


@functools.lru_cache(maxsize=None)
def plain_params(params: type) -> type:
    """``params`` itself when no field is a ``Literal``, else a dataclass of the same fields and
    defaults with each ``Literal`` typed by its values, which OmegaConf accepts."""
    hints = typing.get_type_hints(params)
    if all(literal_choices(hints[f.name]) is None for f in dataclasses.fields(params)):
        return params
    specs = []
    for f in dataclasses.fields(params):
        kwargs = {"default": f.default} if f.default is not dataclasses.MISSING else {}
        if f.default_factory is not dataclasses.MISSING:
            kwargs = {"default_factory": f.default_factory}
        specs.append((f.name, _plain(hints[f.name]), dataclasses.field(**kwargs)))
    return dataclasses.make_dataclass(params.__name__, specs)
