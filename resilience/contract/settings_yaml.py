"""Reading a settings file a user wrote (tier settings, elastic bounds, the health checks) as
YAML: plain data, a bounded size, a bounded expansion.

``yaml.safe_load`` runs no code, but aliases make a few lines stand for billions of values (the
"billion laughs": nested ``*a`` references), and a wrong-typed value was then printed whole
into the one-line error. Aliases are fine where they stay small (``yaml.safe_dump`` writes one
for every object it meets twice), so what is bounded is the data as it expands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from resilience.errors import SettingsUnreadable

MAX_BYTES = 1 << 20
"""Far above any settings file: a bigger one is not one."""
MAX_VALUES = 100_000
"""Values the data may expand to, aliases followed: settings hold tens."""


def load_text(text: str) -> Any:
    """The data of YAML ``text``; raises ``yaml.YAMLError`` for bad YAML or data that expands
    past :data:`MAX_VALUES`."""
    data = yaml.safe_load(text)
    _count(data, [MAX_VALUES])
    return data


def load_file(path: Path) -> Any:
    """The data of a settings file; raises ``OSError`` (unreadable, or larger than
    :data:`MAX_BYTES`), ``UnicodeDecodeError`` or ``yaml.YAMLError``."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise OSError(f"larger than {MAX_BYTES} bytes: not a settings file")
    return load_text(raw.decode())


def read(path: Path) -> Any:
    """:func:`load_file`, with every way it fails as one line (PyYAML's
    messages span lines: the problem, then where)."""
    try:
        return load_file(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SettingsUnreadable(" ".join(str(err).split())) from None


def _count(value: Any, left: list[int]) -> None:
    left[0] -= 1
    if left[0] < 0:
        raise yaml.YAMLError(f"the data expands to more than {MAX_VALUES} values (aliases of aliases?)")
    if isinstance(value, dict):
        for key, item in value.items():
            _count(key, left)
            _count(item, left)
    elif isinstance(value, list):
        for item in value:
            _count(item, left)
