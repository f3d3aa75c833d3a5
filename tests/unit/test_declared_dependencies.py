"""Every third-party module the product imports comes from a dependency it declares.

A missing declaration hides behind the test extras: CI installs ``.[test]``, whose packages pull
in others (``transformers`` brings ``safetensors``), so the suite passes while a user's
``pip install . && sres demo`` ends in ``ModuleNotFoundError``. This reads the imports from the
source (every ``import``, in functions too) and asks the installed distributions' metadata which
distribution provides each name; only ``[project] dependencies`` count. An import guarded by
``except ImportError`` is optional and may come from anywhere (``pyslurm``).
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("launcher", "resilience", "slurm_plugins", "sbatch_templates")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_normal(re.split(r"[\s;<>=!~\[(]", d.strip(), maxsplit=1)[0]) for d in project["dependencies"]}


def _optional(parents: list[ast.AST]) -> bool:
    for node in parents:
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = ast.unparse(handler.type) if handler.type is not None else ""
                if "ImportError" in caught or "ModuleNotFoundError" in caught:
                    return True
    return False


def imports(source: str) -> Iterator[str]:
    """Top-level names of the absolute imports in ``source`` that are not optional."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(ast.parse(source), [])]
    while stack:
        node, parents = stack.pop()
        stack.extend((child, [*parents, node]) for child in ast.iter_child_nodes(node))
        if _optional(parents):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.partition(".")[0]


def undeclared(sources: dict[str, str], deps: set[str], provides: dict[str, list[str]]) -> dict[str, str]:
    """import name -> why it is not covered, for every import of ``sources`` (path -> text)."""
    missing: dict[str, str] = {}
    for path, source in sources.items():
        for name in imports(source):
            if name in sys.stdlib_module_names or name in PRODUCT or name == "__future__":
                continue
            dists = {_normal(d) for d in provides.get(name, [])}
            if not dists:
                missing.setdefault(name, f"{path}: no installed distribution provides it")
            elif not dists & deps:
                missing.setdefault(name, f"{path}: from {', '.join(sorted(dists))}, not declared")
    return missing


def test_the_check_sees_an_undeclared_import_and_skips_an_optional_one():
    provides = {"safetensors": ["safetensors"], "torch": ["torch"], "pyslurm": ["pyslurm"]}
    sources = {
        "a.py": "import torch\ndef f():\n    from safetensors import safe_open\n",
        "b.py": "try:\n    import pyslurm\nexcept ImportError:\n    pyslurm = None\n",
        "c.py": "import os, json\nfrom launcher.errors import SresError\nimport nowhere_to_be_found\n",
    }
    found = undeclared(sources, {"torch"}, provides)
    assert set(found) == {"safetensors", "nowhere_to_be_found"}
    assert "not declared" in found["safetensors"] and "no installed" in found["nowhere_to_be_found"]


def test_every_import_of_the_product_is_a_declared_dependency():
    sources = {
        str(path.relative_to(ROOT)): path.read_text()
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    missing = undeclared(sources, declared(), metadata.packages_distributions())
    assert not missing, "declare these in pyproject.toml [project] dependencies:\n" + "\n".join(
        f"  {name}: {why}" for name, why in sorted(missing.items())
    )
