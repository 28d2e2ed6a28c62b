"""mkdocs hook (mkdocs.yml ``hooks:``): links from a page to repository files outside docs/.

The pages link to the results, code and configs they cite with relative paths
(``../results/x/README.md``), which work when Markdown is read in the repository but which mkdocs
cannot resolve inside the site, so ``--strict`` would fail on every one. This hook checks that each
such target exists in the checkout (a missing one fails the build, as a broken link should) and
rewrites the link: to ``extra.source_url`` + the path when mkdocs.yml sets it (a repository browser,
``https://host/owner/rredcot/blob/main/``), else to plain text naming the repository path.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)", re.M)


def _outside_target(page_src: str, target: str) -> str | None:
    """The repository path of a relative link that leaves docs/, or None for any other link."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#")[0]
    resolved = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_src), path))
    return None if resolved == "docs" or resolved.startswith("docs/") else resolved


def _rewrite(text: str, page_src: str, root: Path, source_url: str) -> str:
    def replace(match: re.Match) -> str:
        bang, label, target = match.groups()
        path = _outside_target(page_src, target)
        if path is None:
            return match.group(0)
        if path.startswith("..") or not (root / path).exists():
            raise PluginError(f"{page_src}: link to {target} ({path}), which is not in the repository")
        if source_url:
            return f"{bang}[{label}]({source_url}{path})"
        return label if label.strip("`") == path.rstrip("/") else f"{label} (`{path}`)"

    return LINK.sub(replace, text)


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).parent
    source_url = (config.get("extra") or {}).get("source_url", "")
    parts = FENCE.split(markdown)
    # FENCE.split keeps the fence markers: text, marker, code, marker, text, ...; code stays as is.
    out, inside = [], False
    for i, part in enumerate(parts):
        if i % 2 == 1:
            out.append(part)
            inside = not inside
            continue
        out.append(part if inside else _rewrite(part, page.file.src_uri, root, source_url))
    return "".join(out)
