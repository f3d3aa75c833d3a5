"""Events read back, checked against the table they were written from.

The writer refuses an event or a field that :mod:`~launcher.observability.event_types` does not
declare; a reader that asks for ``e["event"] == "recoverd"`` or ``fault["ranks"]`` used to get
nothing back, silently: a report with no recoveries, a chaos verdict on no faults. :class:`Event`
and :class:`Timeline` make the read side as strict as the write side: a name or field that no
event type declares is a ``TypeError`` (our bug) at the line that asks for it. An event is still
a ``dict`` (``job.events()`` hands them to users' code, which indexes and serialises them), and a
record of a name this version does not know (an older or newer writer) reads as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from launcher.observability.event_types import BY_NAME, COMMON

_COMMON = frozenset(f.name for f in COMMON)
_FIELDS: dict[str, frozenset[str]] = {
    name: _COMMON | {f.name for f in e.fields} for name, e in BY_NAME.items()
}
_ANY_FIELD = frozenset().union(*_FIELDS.values())


def _declared(names: Iterable[str]) -> tuple[str, ...]:
    names = tuple(names)
    if unknown := [name for name in names if name not in _FIELDS]:
        raise TypeError(f"events.jsonl: no event type {', '.join(map(repr, unknown))} (event_types.py)")
    return names


class Event(dict[str, Any]):
    """One line of ``events.jsonl``: its fields by name, each checked against its event type."""

    @property
    def name(self) -> str:
        return str(dict.__getitem__(self, "event"))

    @property
    def t(self) -> float:
        return float(dict.__getitem__(self, "t"))

    def is_(self, *names: str) -> bool:
        """Whether this event is one of ``names`` (each a declared event type)."""
        return self.name in _declared(names)

    def _field(self, field: str) -> str:
        fields = _FIELDS.get(self.name)
        if fields is not None and field not in fields:
            raise TypeError(f"events.jsonl: {self.name!r} has no field {field!r} (event_types.py)")
        return field

    def __getitem__(self, field: str) -> Any:
        return dict.__getitem__(self, self._field(field))

    def get(self, field: str, default: Any = None) -> Any:  # type: ignore[override]  # one key type
        """A field that may be absent: any event type's field name, so that one scan may ask every
        event for its ``generation``; a name no event type has is still an error."""
        if field not in _ANY_FIELD:
            raise TypeError(f"events.jsonl: no event type has a field {field!r} (event_types.py)")
        return dict.get(self, field, default)


class Timeline(Sequence[Event]):
    """A run's events in the order they were written, with lookups by declared name."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        self._events = [r if isinstance(r, Event) else Event(r) for r in records]

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> Timeline: ...
    def __getitem__(self, index: int | slice) -> Event | Timeline:
        if isinstance(index, slice):
            return Timeline(self._events[index])
        return self._events[index]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __add__(self, other: Iterable[dict[str, Any]]) -> Timeline:
        return Timeline([*self._events, *other])

    def of(self, *names: str) -> list[Event]:
        """The events of these types, in order."""
        wanted = _declared(names)
        return [e for e in self._events if e.name in wanted]

    def first(self, *names: str) -> Event | None:
        return next(iter(self.of(*names)), None)

    def last(self, *names: str) -> Event | None:
        found = self.of(*names)
        return found[-1] if found else None

    def count(self, *names: str) -> int:  # type: ignore[override]  # Sequence.count(value)
        return len(self.of(*names))


def timeline(records: Sequence[dict[str, Any]] | Timeline) -> Timeline:
    """``records`` as a :class:`Timeline` (the same one when it already is)."""
    return records if isinstance(records, Timeline) else Timeline(records)
