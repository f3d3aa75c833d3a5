"""Reading a settings file a user wrote (tier settings, elastic bounds, the health checks) as
YAML: plain data only, no aliases, a bounded size.

``yaml.safe_load`` runs no code, but it does expand aliases: a few lines of nested ``*a``
references (the "billion laughs") become billions of entries, and a wrong-typed value was then
printed whole into the one-line error. Settings never need an alias.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20
"""Far above any settings file: a bigger one is not one."""


class _NoAliases(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types here
    def compose_node(self, parent: Any, index: Any) -> Any:  # PyYAML's hook
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name): settings take plain values", mark
            )
        return super().compose_node(parent, index)


def load_text(text: str) -> Any:
    """The data of YAML ``text``; raises ``yaml.YAMLError`` for an alias or bad YAML."""
    return yaml.load(text, Loader=_NoAliases)  # a SafeLoader that also refuses aliases


def load_file(path: Path) -> Any:
    """The data of a settings file; raises ``OSError`` (unreadable, or larger than
    :data:`MAX_BYTES`), ``UnicodeDecodeError`` or ``yaml.YAMLError``."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise OSError(f"larger than {MAX_BYTES} bytes: not a settings file")
    return load_text(raw.decode())
