"""The repository layout the project was asked for (issue 15): pyproject.toml, rredcot_cli/,
conf/, tests/, runs/ (ignored by git), README.md; conf/ installs as the package rredcot_cli.conf."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rredcot_cli.config.search import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_top_level_layout():
    for name in ["pyproject.toml", "rredcot_cli", "conf", "tests", "README.md"]:
        assert (ROOT / name).exists(), name
    assert not (ROOT / "rredcot_cli" / "conf").exists(), "the config tree lives in conf/ at the top"
    assert "/runs/" in (ROOT / ".gitignore").read_text().split()


def test_installed_package_finds_the_top_level_conf():
    assert CONF_DIR == (ROOT / "conf").resolve()
    assert (CONF_DIR / "config.yaml").is_file()


def test_pyproject_lists_every_subpackage():
    """pyproject lists packages explicitly (the package-dir mapping of conf/ needs it): a new
    subpackage of rredcot_cli must be listed too, or a wheel would leave it out."""
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    assert setuptools["package-dir"] == {"rredcot_cli.conf": "conf"}
    found = {"rredcot_cli.conf"}
    for init in (ROOT / "rredcot_cli").rglob("*.py"):
        folder = init.parent
        if "__pycache__" in folder.parts:
            continue
        found.add(".".join(folder.relative_to(ROOT).parts))
    assert found <= listed, f"add to pyproject's [tool.setuptools] packages: {sorted(found - listed)}"
