"""The package's import structure, read from the source with ast (nothing is imported):

- an import inside a function says why it is there (``# deferred: ...`` or ``# optional
  dependency: ...``): keeping ``import rredcot_cli`` / ``rredcot --help`` light, a package that is
  not always installed, or another reason in a few words;
- no import circle among rredcot_cli's modules at module level;
- only the CLI and the stages themselves import ``rredcot_cli.stages`` (the wings below them take
  objects and settings, not the config);
- the wings stand in one order (``WING_ORDER``): every import that runs, inside a function or
  not, runs down it, so no two wings import each other, directly or round a circle (annotations
  under ``TYPE_CHECKING`` may name the typed settings of ``config/schema.py`` the stages hand down);
- store/ and config/ (and the report stage) import no torch.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rredcot_cli"
REASONS = ("deferred", "optional dependency")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (the config tree excluded)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1] == "conf":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(tree: ast.Module):
    """(import node, inside a function?, under ``if TYPE_CHECKING``?) for every import in ``tree``."""
    def walk(node, in_function, type_only):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function, type_only
            checking = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                            type_only or checking)
    yield from walk(tree, False, False)


def _imported_modules(node, module: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The package's modules an import statement runs: each named module and its parent packages."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for name in names:
        parts = name.split(".")
        for k in range(2, len(parts) + 1):
            candidate = ".".join(parts[:k])
            if candidate in known:
                found.add(candidate)
    return found - {module}


def _says_why(lines: list[str], node, import_lines: set[int]) -> bool:
    """A reason on the statement's own lines, or in the comment right above its block of imports
    (blank lines and other imports may sit between)."""
    own = range(node.lineno, node.end_lineno + 1)
    if any("#" in lines[k - 1] and any(r in lines[k - 1].split("#", 1)[1] for r in REASONS) for k in own):
        return True
    k = node.lineno - 1
    while k >= 1 and (k in import_lines or not lines[k - 1].strip()):
        k -= 1
    text = lines[k - 1].strip() if k >= 1 else ""
    return text.startswith("#") and any(r in text for r in REASONS)


def test_function_level_imports_say_why():
    unexplained = []
    for name, path in _modules().items():
        source = path.read_text()
        lines = source.splitlines()
        found = list(_imports(ast.parse(source)))
        import_lines = {k for node, _, _ in found for k in range(node.lineno, node.end_lineno + 1)}
        for node, in_function, _ in found:
            if in_function and not _says_why(lines, node, import_lines):
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, ("imports inside functions without '# deferred: why' or '# optional dependency: ...' "
                             "(or move them to the top of the module):\n" + "\n".join(unexplained))


def _module_level_graph() -> dict[str, set[str]]:
    known = _modules()
    graph = {}
    for name, path in known.items():
        edges = set()
        for node, in_function, type_only in _imports(ast.parse(path.read_text())):
            if not in_function and not type_only:
                edges |= _imported_modules(node, name, path.name == "__init__.py", known)
        graph[name] = {e for e in edges if not name.startswith(e + ".")}  # a package may import its own modules
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_at_module_level():
    graph = _module_level_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the graph was read
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_cli_and_the_stages_import_the_stages():
    importers = []
    for name, path in _modules().items():
        if name == "rredcot_cli.cli" or name.startswith("rredcot_cli.stages"):
            continue
        for node, _, _ in _imports(ast.parse(path.read_text())):
            if any(m.startswith("rredcot_cli.stages") for m in _imported_modules(node, name, False, _modules())):
                importers.append(f"{name}:{node.lineno}")
    assert importers == []


def test_store_config_and_report_import_no_torch():
    """The README's one-way rule: store/ and config/ import no torch, so `rredcot --help` and
    `rredcot report` stay fast (a function-level import marked "deferred" keeps it so)."""
    names = [n for n in _modules() if n.startswith(("rredcot_cli.store", "rredcot_cli.config"))]
    names.append("rredcot_cli.stages.report")
    code = f"import importlib, sys; [importlib.import_module(n) for n in {names!r}]; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"



# The package's rooms (its subpackages and top-level modules) in tiers, bottom first. A room
# imports rooms of lower tiers only; the one wing of two rooms, credit methods and the value
# estimators they use, imports itself both ways (values take the methods' contract, CreditBatch;
# the methods call the estimators). A new room needs a tier here; an import that runs up the
# order is a loop between wings (issue 40: store -> config.compose.config_hash while config imported
# the store; pipeline -> train.update.ForwardPass while the train loop imported the pipeline).
WING_ORDER = (
    ("errors", "console", "docstrings", "metrics", "rng", "segmenters"),  # import nothing of the package
    ("data", "plugins"),
    ("store", "policy", "benchmarks"),  # the run store (no torch); the models and backends; the tasks
    ("methods", "values"),
    ("config",),  # checks method and benchmark options against their registries; reads the store's artifacts
    ("credit",),
    ("pipeline",),
    ("train",),
    ("integrations", "preflight", "report", "catalog"),
    ("stages",),
    ("cli",),
    ("__main__",),
)
ONE_WING = {"methods": "values", "values": "methods"}


def _room(module: str) -> str:
    """The top-level room of a module: ``rredcot_cli.train.update`` -> ``train``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def wing_arrows() -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) -> where, for every import of one room by another that runs
    (at module level and inside functions; not the annotations under TYPE_CHECKING, which name the
    config schema's typed settings a stage hands down; the package root, which only holds the
    version, left out)."""
    known = _modules()
    arrows: dict[tuple[str, str], list[str]] = {}
    for name, path in known.items():
        for node, _, type_only in _imports(ast.parse(path.read_text())):
            if type_only:
                continue
            for target in _imported_modules(node, name, path.name == "__init__.py", known):
                pair = (_room(name), _room(target))
                if pair[1] and pair[0] != pair[1]:
                    arrows.setdefault(pair, []).append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return arrows


def _runs_up(arrows: dict[tuple[str, str], list[str]], order=WING_ORDER) -> list[str]:
    tier = {room: k for k, rooms in enumerate(order) for room in rooms}
    return [f"{a} -> {b} ({', '.join(sorted(set(where)))})" for (a, b), where in sorted(arrows.items())
            if ONE_WING.get(a) != b and tier[b] >= tier[a]]


def test_every_room_has_a_tier_in_the_wing_order():
    rooms = {_room(name) for name in _modules()} - {""}
    listed = [room for rooms_ in WING_ORDER for room in rooms_]
    assert len(listed) == len(set(listed))
    assert rooms == set(listed), f"rooms without a tier in WING_ORDER: {sorted(rooms - set(listed))}; gone: " \
                                 f"{sorted(set(listed) - rooms)}"


def test_imports_run_down_the_wing_order():
    arrows = wing_arrows()
    assert len(arrows) > 50  # the arrows were read
    up = _runs_up(arrows)
    assert not up, ("imports that run up the wing order (tests/test_house.py WING_ORDER): hand the lower wing "
                    "what it needs, or move the code down to where it is used:\n" + "\n".join(up))
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
    assert _cycles(graph) == [["methods", "values"]]  # the one wing of two rooms, and no other circle


def test_the_wing_order_rule_finds_an_arrow_running_up():
    arrows = {("store", "config"): ["rredcot_cli/store/runs.py:43"], ("config", "store"): ["compose.py:156"],
              ("values", "methods"): ["values/registry.py:23"]}
    assert _runs_up(arrows) == ["store -> config (rredcot_cli/store/runs.py:43)"]
