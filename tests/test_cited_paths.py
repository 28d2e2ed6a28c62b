"""Every repository path that README.md, docs/**/*.md and results/**/README.md cite exists in the repository
(issue 39: `.gitignore`'s bare `runs/` swallowed results/real-model-h200/runs/ while the docs went on
citing it), and a results folder named runs/ can be committed.

"Exists in the repository" means tracked, or untracked and not ignored (what a commit would take),
so a file that sits on disk but is ignored counts as missing. What is cited:

- relative Markdown links, resolved from the citing file (links leaving the repository are not
  repository paths);
- in inline code and code blocks, every whitespace-separated token with a ``/`` that starts with a
  top-level folder of the repository (``results/...``, ``bench/...``) or with ``../``; in a results
  README also one relative to its own folder (``runs/``, ``report/``), found there or anywhere below
  it (a bullet's sub-items name files inside the folder it describes). A placeholder or glob
  (``<method>``, ``*``, ``{a,b}``) ends the checked part; tokens with ``...`` are patterns, not paths.

A path that is gone for good is listed in ``LOST`` with why, and passes only where the citing file
says plainly that it was lost.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
PLACEHOLDER = re.compile(r"[<>*{}$\[\]?]")
# Paths that are cited and gone for good, with why; a file citing one must say so in its text (it
# says "lost" and names `.gitignore`), so a reader is never sent looking for it.
LOST = {
    "results/real-model-h200/runs": ".gitignore's unanchored runs/ pattern kept the H200 study's per-run "
                                    "folders out of every commit (issue 39)",
}
# Files a guide tells readers to write themselves, in their own config folder.
WRITTEN_BY_THE_READER = {
    "docs/extending.md": {"conf/experiment/mine.yaml", "conf/benchmark/mod10.yaml", "conf/experiment/broken.yaml"},
    # `ln -s ../conf ...`: a symbolic link's target, relative to the link's own folder, not to the page.
    "docs/studies/real-model-speed.md": {"../conf"},
}


def _repository_paths() -> set[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: what the repository holds is git's answer")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    found = set(listed)
    for path in listed:
        found.update(str(parent) for parent in Path(path).parents if str(parent) != ".")
    return found


def _checked_part(token: str) -> str:
    """The path up to the first placeholder or glob component, without a trailing slash."""
    parts = []
    for part in token.split("/"):
        if PLACEHOLDER.search(part):
            break
        parts.append(part)
    return "/".join(parts).rstrip("/")


def _code_tokens(text: str):
    for block in CODE.finditer(text):
        for token in block.group(0).strip("`").split():
            if "..." in token or "…" in token:
                continue
            token = token.strip("'\",;()").rstrip(".:").split(":")[0]  # file.py:function, trailing punctuation
            if "/" in token and "=" not in token and not token.startswith(("/", "~", "http")):
                yield token


def cited_paths(doc: Path, top_level: set[str]) -> list[tuple[str, str, bool]]:
    """``(as written, repository path, may lie below)`` for every path ``doc`` cites."""
    text, folder = doc.read_text(), doc.parent.relative_to(ROOT)
    results_readme = folder.parts[:1] == ("results",) and doc.name == "README.md"
    found = []
    for link in LINK.finditer(text):
        target = link.group(1).split("#")[0]
        if target and not re.match(r"[a-z]+:", target):
            found.append((target, os.path.normpath(folder / target), False))
    for token in _code_tokens(text):
        path = _checked_part(token)
        first = path.split("/")[0]
        if first in top_level:
            found.append((token, os.path.normpath(path), False))
        elif first == ".." or (results_readme and path):
            found.append((token, os.path.normpath(folder / path), first != ".."))
    return [(written, path, below) for written, path, below in found if not path.startswith("..")]


def missing_citations() -> list[str]:
    known = _repository_paths()
    top_level = {path.split("/")[0] for path in known if "/" in path}
    # docs/reference/ is generated from the code, whose own citations the code tests below check.
    docs = ([ROOT / "README.md"] + sorted(p for p in ROOT.glob("docs/**/*.md") if "reference" not in p.parts)
            + sorted(ROOT.glob("results/**/README.md")))
    missing = []
    for doc in docs:
        name = doc.relative_to(ROOT).as_posix()
        for written, path, below in cited_paths(doc, top_level):
            if path in known or written in WRITTEN_BY_THE_READER.get(name, ()):
                continue
            if path in LOST and "lost" in doc.read_text() and ".gitignore" in doc.read_text():
                continue
            folder = os.path.dirname(name)
            if below and any(k.startswith(folder + "/") and (k.endswith("/" + path[len(folder) + 1:]))
                             for k in known):
                continue
            missing.append(f"{name}: `{written}` ({path})")
    return sorted(set(missing))


def test_every_path_the_docs_and_results_readmes_cite_is_in_the_repository():
    missing = missing_citations()
    assert not missing, ("cited but not in the repository (commit it, or say plainly in the citing text that "
                         "it was lost and why):\n" + "\n".join(missing))


def test_a_results_folder_named_runs_is_not_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path]).returncode == 0

    assert ignored("runs/quick/train/summary.json")  # the default run dirs stay out of the repository
    assert not ignored("results/real-model-h200/runs/grpo-lr1e-5-seed0/train/summary.json")
    assert not ignored("results/some-study/runs/x/train/metrics.parquet")


# --------------------------------------------------------------------------- code and configs

# Where code and configs cite documentation pages and package modules: docstrings, comments and help
# texts of these folders. (Results files a script writes, or a plugin a test makes, need not exist.)
CITING_CODE = ("rredcot_cli", "conf", "bench", "scripts", "tests")
CODE_CITATION = re.compile(r"(?<![\w./$~-])((?:docs|rredcot_cli)/[\w./-]*[\w-])")
# The design notes as the code once cited them, from outside the repository (before docs/design/).
BARE_DESIGN_NOTE = re.compile(r"(?<![\w/-])(?:shared/docs/)?(design|rredcot-method|peer-methods)\.md")


# Modules that moved, as docstrings used to name them, and where they went.
MOVED_MODULES = {
    re.compile(r"(?<![\w/])backends/"): "rredcot_cli/policy/",
    re.compile(r"(?<![\w.])rollout\.(?:encode_prompt|credit_batch|\w+_batch)\b"): "policy.load.encode_prompt, pipeline.credit_batch",
}


def _code_files():
    for folder in CITING_CODE:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".yaml", ".sh"} and path.is_file():
                yield path


def missing_code_citations(known: set[str]) -> list[str]:
    """``file:line: path`` for every repository path a code or config file cites that is not in the
    repository (a folder counts; a trailing ``.`` of the sentence does not)."""
    missing = []
    for path in _code_files():
        name = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in CODE_CITATION.finditer(line):
                cited = _checked_part(match.group(1)).rstrip(".")
                if cited and cited not in known:
                    missing.append(f"{name}:{number}: {cited}")
    return missing


def test_every_repository_path_the_code_and_configs_cite_exists():
    missing = missing_code_citations(_repository_paths())
    assert not missing, "cited by code or config but not in the repository (moved? point it at the new place):\n" + \
        "\n".join(missing)


def test_the_design_notes_are_cited_inside_the_repository():
    """Docstrings and configs cite the design notes under docs/design/, not by a bare name that
    sends a reader to files outside the repository."""
    bare = [f"{path.relative_to(ROOT).as_posix()}:{number}: {line.strip()}"
            for path in _code_files() if path.name != "test_cited_paths.py"
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if any(not line[:m.start()].endswith("docs/design/") for m in BARE_DESIGN_NOTE.finditer(line))]
    assert not bare, "cite docs/design/<note>.md:\n" + "\n".join(bare)


def test_no_code_names_a_module_that_moved():
    stale = [f"{path.relative_to(ROOT).as_posix()}:{number}: {line.strip()} (now {where})"
             for path in _code_files() if path.name != "test_cited_paths.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             for pattern, where in MOVED_MODULES.items() if pattern.search(line)]
    assert not stale, "names a module that moved:\n" + "\n".join(stale)


MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|Users)/[\w.-]+")


def test_no_page_of_the_docs_names_a_path_of_one_machine():
    """A reader's checkout is not the development machine's /work/main: commands and citations
    name repository paths (bench/x.py, .venv-vllm/bin/python) or placeholders (<main checkout>)."""
    found = [f"{doc.relative_to(ROOT).as_posix()}:{number}: {match.group(0)}"
             for doc in [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]
             for number, line in enumerate(doc.read_text().splitlines(), 1)
             for match in MACHINE_PATH.finditer(line)]
    assert not found, "absolute paths of a development machine:\n" + "\n".join(found)
