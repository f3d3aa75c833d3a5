"""docs/reference/modules.md: every module of the three packages, from its docstring.

One section per package and sub-package (a folder with ``__init__.py``), in path order: the
first paragraph of the folder's ``__init__.py`` docstring, then one row per module beside it
(``__init__.py`` and ``__main__.py`` left out) with the first paragraph of its docstring. The
docstrings are read with :mod:`ast`, never by importing a module: the page costs no torch and
runs no code of the modules. ``docs/generate.py`` writes it with the other generated pages and
passes in its Markdown helpers (``text``, ``cell``), so this module needs nothing of it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("launcher", "resilience", "slurm_plugins")
LEFT_OUT = ("__init__.py", "__main__.py")

_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]+?)(?:\s*<[^>]*>)?`")
"""A Sphinx cross-reference (``:class:`~a.B` ``, ``:mod:`title <a.b>` ``) in a docstring."""


def first_paragraph(path: Path) -> str:
    """The first paragraph of a module's docstring (empty without one), on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(first.split())


def _plain_roles(words: str) -> str:
    """Sphinx roles as Markdown reads them: the name as code (``~`` keeps its last part), an
    explicit title as plain words."""

    def one(match: re.Match[str]) -> str:
        tilde, name = match.groups()
        if "<" in match.group(0):
            return name.strip()
        return f"``{name.rpartition('.')[2] if tilde else name}``"

    return _ROLE.sub(one, words)


def folders(root: Path) -> list[Path]:
    """Every package and sub-package of :data:`PACKAGES`, relative to ``root``, in path order."""
    found = [
        p.parent.relative_to(root) for package in PACKAGES for p in (root / package).rglob("__init__.py")
    ]
    return sorted(found, key=lambda folder: folder.parts)


def modules_page(root: Path, header: str, text: Callable[[str], str], cell: Callable[[str], str]) -> str:
    lines = [
        "# Modules",
        "",
        header,
        "",
        "Every module of `launcher/`, `resilience/` and `slurm_plugins/`, by folder: the first "
        "paragraph of its docstring (the rest of the docstring, and the code, say more). How the "
        "parts fit together is [ARCHITECTURE.md](../../ARCHITECTURE.md).",
        "",
    ]
    for folder in folders(root):
        lines += [f"## `{folder.as_posix()}/`", ""]
        intro = first_paragraph(root / folder / "__init__.py")
        if intro:
            lines += [text(_plain_roles(intro)), ""]
        modules = sorted(p for p in (root / folder).glob("*.py") if p.name not in LEFT_OUT)
        if modules:
            lines += ["| module | what it is for |", "|---|---|"]
            lines += [f"| `{p.name}` | {cell(_plain_roles(first_paragraph(p)))} |" for p in modules]
            lines += [""]
    return "\n".join(lines).rstrip() + "\n"
