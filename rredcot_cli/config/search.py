"""Where config files are found: the packaged ``conf/`` tree, the user's config folders before it
(``--config-dir DIR``, ``$RREDCOT_CONFIG_PATH``), the options of each group and their defaults.

The CLI imports this module to list the groups in ``rredcot --help``: it imports no Hydra,
OmegaConf, yaml or registry at import time (yaml is imported inside ``default_options``, marked
"deferred").
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Sequence

from rredcot_cli.errors import ConfigError
from rredcot_cli.plugins import plugin_options

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
# User config folders searched before CONF_DIR, separated like PATH; `--config-dir DIR` prepends.
CONFIG_PATH_ENV = "RREDCOT_CONFIG_PATH"


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


def group_options(config_dirs: Sequence[str | Path] = ()) -> dict[str, list[str]]:
    """Each config group (a folder of the packaged ``conf/``) and its options, sorted: the YAML
    files of that folder in the packaged tree and in the user's config folders, plus the credit
    methods and benchmarks of plugins (entry points, ``plugins=``), which need no YAML file."""
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
    import yaml  # deferred: --help

    primary = next(d / f"{CONFIG_NAME}.yaml" for d in search_dirs(config_dirs) if (d / f"{CONFIG_NAME}.yaml").is_file())
    defaults = yaml.safe_load(primary.read_text()).get("defaults", [])
    chosen: dict[str, str | None] = {}
    for entry in defaults:
        if isinstance(entry, dict):
            for key, value in entry.items():
                chosen[key.replace("optional ", "").strip()] = value
    return chosen
