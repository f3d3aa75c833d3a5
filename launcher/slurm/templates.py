"""``sres template NAME``: the sbatch scripts of ``sbatch_templates/``, filled in.

Each template declares its variables on ``#@ name = default  # meaning`` lines and uses them as
``{{name}}``; the declaration is the single place a user edits by hand, and what ``--set``
changes. ``total_nodes`` (nodes + spares) is derived, never set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from launcher.errors import ConfigError

_DECL = re.compile(r"^#@\s*(\w+)\s*=\s*(.*?)\s*(#.*)?$")
_USE = re.compile(r"\{\{(\w+)\}\}")
_INTS = {"nodes", "spares", "procs_per_node", "gpus_per_node", "retries", "max_requeues", "preempt_grace"}


@dataclass(frozen=True)
class Template:
    name: str
    text: str

    @property
    def variables(self) -> dict[str, str]:
        """Declared variables and their defaults, in order."""
        return {m.group(1): m.group(2) for m in map(_DECL.match, self.text.splitlines()) if m}

    @property
    def summary(self) -> str:
        first = self.text.splitlines()[1] if self.text.count("\n") > 1 else ""
        return first.removeprefix("# ").split(": ", 1)[-1]

    def fill(self, values: dict[str, str]) -> str:
        declared = self.variables
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise ConfigError(
                f"{self.name} has no variable {', '.join(unknown)}; it has: {', '.join(declared)}"
            )
        merged = {**declared, **values}
        for key in _INTS & merged.keys():
            if not re.fullmatch(r"\d+", merged[key]):
                raise ConfigError(f"{key}={merged[key]!r}: a whole number is needed")
        if "nodes" in merged and int(merged["nodes"]) < 1:
            raise ConfigError("nodes must be at least 1")
        if {"nodes", "spares"} <= merged.keys():
            merged["total_nodes"] = str(int(merged["nodes"]) + int(merged["spares"]))
        lines = []
        for line in self.text.splitlines(keepends=True):
            m = _DECL.match(line.rstrip("\n"))
            if m and m.group(1) in values:  # keep the declaration true to what was filled in
                comment = f"  {m.group(3)}" if m.group(3) else ""
                line = f"#@ {m.group(1)} = {values[m.group(1)]}{comment}\n"
            lines.append(line)
        return _USE.sub(lambda m: merged[m.group(1)], "".join(lines))


def names() -> list[str]:
    return sorted(p.name for p in resources.files("sbatch_templates").iterdir() if p.name.endswith(".sbatch"))


def load(name: str) -> Template:
    file = name if name.endswith(".sbatch") else f"{name}.sbatch"
    if file not in names():
        raise ConfigError(f"no template {name!r}; templates: {', '.join(names())}")
    return Template(file, resources.files("sbatch_templates").joinpath(file).read_text())


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {pair!r}: expected NAME=VALUE")
        out[key.strip()] = value
    return out
