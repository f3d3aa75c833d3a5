"""What an event type is: its :class:`Field` s and :class:`EventType`, and who writes it
(``source``: the supervisor itself, or a rank through the store). The tables are
:mod:`launcher.observability.event_types` and :mod:`launcher.observability.rank_event_types`."""

from __future__ import annotations

from dataclasses import dataclass

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
