"""What an event type is: its :class:`Field` s and :class:`EventType`, and who writes it
(``source``: the supervisor itself, or a rank through the store). The tables are
:mod:`launcher.observability.event_types` and :mod:`launcher.observability.rank_event_types`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

SUPERVISOR = "supervisor"
RANK = "rank"


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    """The JSON value as Python reads it: ``int``, ``float``, ``str``, ``bool``, ``list[...]``,
    ``dict[...]``; ``| None``: the value may be null."""
    meaning: str
    optional: bool = False
    """May be absent: present only where it applies."""


@dataclass(frozen=True)
class EventType:
    name: str
    meaning: str
    source: str
    """``supervisor`` or ``rank`` (sent through the store)."""
    fields: tuple[Field, ...]


COMMON: tuple[Field, ...] = (
    Field("event", "str", "the event type's name"),
    Field("t", "float", "wall-clock time (Unix seconds) it happened, or as the event says"),
)
"""Fields of every line."""


RANK_FIELD = Field("rank", "int", "the rank that wrote it")


def value_matches(value: Any, type_: str) -> bool:
    """Whether a JSON value read back is of a :attr:`Field.type`: what readers of the log
    compute with (``sres report`` subtracts times) must not meet a string, a list or a
    non-finite number that a corrupt or hand-edited line put there."""
    if type_.endswith(" | None"):
        return value is None or value_matches(value, type_.removesuffix(" | None"))
    if (inner := re.fullmatch(r"list\[(.+)\]", type_)) is not None:
        return isinstance(value, (list, tuple)) and all(value_matches(v, inner[1]) for v in value)
    if (inner := re.fullmatch(r"dict\[str, (.+)\]", type_)) is not None:
        return isinstance(value, dict) and all(
            isinstance(k, str) and value_matches(v, inner[1]) for k, v in value.items()
        )
    if type_ == "bool":
        return isinstance(value, bool)
    if type_ == "str":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if type_ == "int":
        return isinstance(value, int)
    if type_ == "float":
        return True
    raise ValueError(f"an event field type no reader knows: {type_!r}")
