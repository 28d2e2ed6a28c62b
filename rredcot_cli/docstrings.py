"""One line from a docstring or a config file's header comment, for listings (``rredcot list``)."""

from __future__ import annotations

import re


def doc_summary(doc: str | None, name: str = "") -> str:
    """One line from a docstring for a listing: its first paragraph, on one line, without the
    parenthesised asides (citations), with `code` marks, and without a leading "``name``:"."""
    if not doc or not doc.strip():
        return ""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    kept, depth = [], 0
    for char in text:
        depth += char == "("
        if depth == 0:
            kept.append(char)
        depth -= char == ")" and depth > 0
    text = " ".join("".join(kept).replace("``", "`").split())
    for prefix in (f"{name}: ", f"`{name}`: "):  # "``mc``: VinePPO-style ..." listed under the name mc
        if name and text.startswith(prefix):
            text = text[len(prefix):]
    return re.sub(r"\s+([.,:;])", r"\1", text)


def comment_summary(text: str) -> str:
    """One line from a YAML file's leading comment: its first paragraph up to a usage example
    (a line indented after the ``#``), as ``doc_summary`` shortens it; "" without a comment."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line[1:]
        if body.startswith("   ") or not body.strip():  # "#   rredcot train ..." or "#"
            break
        lines.append(body.strip())
    return first_sentence(doc_summary("\n".join(lines)))


def first_sentence(text: str) -> str:
    """``text`` up to its first sentence end (". " then a capital, not after "Dr" or "e.g"), the
    rest dropped."""
    found = re.search(r"(?<!\bDr)(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.\s+(?=[A-Z])", text)
    return text[: found.start() + 1] if found else text
