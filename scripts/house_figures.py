"""The house's figures, for a before/after of a refactor (issue 40's closing note): the longest
functions and the largest argument counts in the package, the README's size, the docs pages and
the lines of bench/. Reads the source as text (ast); runs nothing.

    python scripts/house_figures.py [ROOT] [--top 10]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def functions(package: Path) -> list[tuple[int, int, str]]:
    """(lines, arguments, "path:qualified.name") of every function and method under ``package``;
    arguments count every named parameter (self and cls included) plus 1 for *args and 1 for **kwargs."""
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                    name = f"{prefix}{child.name}"
                    out.append((child.end_lineno - child.lineno + 1, count, f"{path.relative_to(package.parent)}:{name}"))
                    stack.append((child, f"{name}."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}."))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=".", type=Path)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    found = functions(args.root / "rredcot_cli")
    print(f"longest {args.top} functions (lines):")
    for lines, _, name in sorted(found, reverse=True)[: args.top]:
        print(f"  {lines:4d}  {name}")
    print(f"functions of 60 lines or more: {sum(lines >= 60 for lines, _, _ in found)}")
    print(f"largest argument counts:")
    for _, count, name in sorted(found, key=lambda f: (-f[1], f[2]))[:3]:
        print(f"  {count:4d}  {name}")
    readme = args.root / "README.md"
    print(f"README.md: {readme.stat().st_size / 1000:.1f} kB, {len(readme.read_text().splitlines())} lines")
    docs = sorted(p.relative_to(args.root).as_posix() for p in (args.root / "docs").rglob("*.md"))
    print(f"docs/: {len(docs)} pages")
    bench = [p for p in (args.root / "bench").iterdir() if p.suffix in (".py", ".sh")]
    print(f"bench/: {len(bench)} scripts, {sum(len(p.read_text().splitlines()) for p in bench)} lines")


if __name__ == "__main__":
    main()
