"""events.jsonl: one JSON object per line, the timeline of a run.

Every fault, re-formation and recovery is an event with a wall-clock ``t``, so that the
timeline of a fault can be rebuilt and measured after the fact (tests and benchmarks read
this file, never the console). Every event type and its fields are declared in
:mod:`launcher.observability.event_types`; :meth:`EventLog.emit` refuses any other.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.observability.event_schema import value_matches
from launcher.observability.event_types import COMMON, EVENT_TYPES
from launcher.observability.timeline import Event, Timeline, timeline

INTERRUPTED = "interrupted"
"""The ``failed`` event's reason for a run stopped by SIGINT (Ctrl-C, a cancel): no outcome of its own."""

_DECLARED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    e.name: (
        frozenset(f.name for f in (*COMMON, *e.fields)),
        frozenset(f.name for f in e.fields if not f.optional),
    )
    for e in EVENT_TYPES
}
"""Event name -> (every field it may have, the fields it must be given): the writer's check."""
_TYPES: dict[str, dict[str, str]] = {
    e.name: {f.name: f.type for f in (*COMMON, *e.fields)} for e in EVENT_TYPES
}
"""Event name -> field -> its declared type: checked by the writer and by every reader."""
_COMMON_TYPES = {f.name: f.type for f in COMMON}


class EventLog:
    def __init__(self, path: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.wall = wall
        self._file = self.path.open("a", buffering=1)
        self.events: list[Event] = []
        self.listeners: list[Callable[[Event], None]] = []
        """Called with each record once it is written (live metrics)."""
        self._lock = threading.Lock()  # Supervisor.flush_persistent may emit from another thread

    def emit(self, event: str, **fields: Any) -> Event:
        """Write one line; ``TypeError`` (our bug) for an event or field not declared in
        :mod:`~launcher.observability.event_types`, or a declared field missing."""
        _check(event, fields)
        record = Event(event=event, **fields)
        record.setdefault("t", self.wall())
        with self._lock:
            self._file.write(json.dumps(record, sort_keys=False) + "\n")
            self.events.append(record)
            for listener in self.listeners:
                listener(record)
        return record

    def close(self) -> None:
        self._file.close()


def _check(event: str, fields: dict[str, Any]) -> None:
    """Cheap, on every line: a dict lookup and two set differences."""
    declared = _DECLARED.get(event)
    if declared is None:
        raise TypeError(f"events.jsonl: {event!r} is not declared in launcher/observability/event_types.py")
    allowed, required = declared
    if unknown := fields.keys() - allowed:
        raise TypeError(f"events.jsonl: {event!r} has no field {', '.join(sorted(unknown))} (event_types.py)")
    if missing := required - fields.keys():
        raise TypeError(f"events.jsonl: {event!r} lacks {', '.join(sorted(missing))} (event_types.py)")
    if wrong := mistyped({"event": event, **fields}):
        raise TypeError(f"events.jsonl: {wrong} (event_types.py)")


def mistyped(record: dict[str, Any]) -> str | None:
    """The first field of ``record`` whose value is not of its declared type, said for a user;
    None when every one is. An event name no table declares (a newer writer's) has only the
    common fields checked."""
    types = _TYPES.get(record["event"], _COMMON_TYPES)
    for name in record.keys() & types.keys():
        if not value_matches(record[name], types[name]):
            return (
                f"field {name!r} of a {record['event']!r} event is {_shown(record[name])}, not {types[name]}"
            )
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_ASK = ": is this a run's events.jsonl?"


def read_events(path: Path) -> Timeline:
    """The events of a run's ``events.jsonl`` (see :func:`read_jsonl`); a record without an
    event name is a ConfigError naming its line."""
    records = read_jsonl(path)
    for number, record in records:
        if not isinstance(record.get("event"), str):
            raise ConfigError(f"{path}:{number}: not an event (no event name){_ASK}")
        if wrong := mistyped(record):
            raise ConfigError(f"{path}:{number}: {wrong} (a corrupt log?)")
    return Timeline(record for _, record in records)


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of each JSON object in ``path``. A last line cut off mid-write (the
    writer was killed, or is writing) is left out; any other line that is not a JSON object is
    a ConfigError naming it."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines) and not text.endswith("\n"):
                break  # torn by a kill mid-write
            raise ConfigError(f"{path}:{number}: not a JSON record (a corrupt log?)") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path}:{number}: not a JSON record (a corrupt log?)")
        records.append((number, record))
    return records


def summary(records: list[Event] | Timeline) -> str:
    """The short human summary ``sres run`` prints at the end."""
    events = timeline(records)
    faults = events.of("fault")
    lines = _end_lines(events.last("finished", "failed"), len(faults))
    lines += [_fault_line(fault) for fault in faults]
    lines += [line for line in map(_change_line, events) if line]
    lines += [_recovered_line(rec) for rec in events.of("recovered")]
    return "\n".join(lines)


def _end_lines(end: Event | None, faults: int) -> list[str]:
    if end is None:
        return ["run did not finish"]
    if end.is_("failed"):
        return [f"run FAILED: {end['reason']}"]
    goodput = end.get("goodput")
    lines = [
        f"run finished: {end['steps']} steps, {faults} fault(s), goodput {goodput:.1%}"
        if goodput is not None
        else f"run finished: {end['steps']} steps"
    ]
    causes = end.get("goodput_by_cause") or {}
    if causes:
        spent = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in causes.items() if abs(v) >= 0.005)
        lines.append(f"  wall {sum(causes.values()):.2f} s: {spent}")
    return lines


def _fault_line(fault: Event) -> str:
    where = f"rank {fault['rank']}" if fault.get("rank") is not None else f"node {fault.get('node')}"
    why = f": {fault['why']}" if fault.get("why") else ""
    return (
        f"  fault: {fault['kind']} {where} (node {fault.get('host', fault.get('node'))}{why}) "
        f"at step {fault.get('step')}"
    )


def _change_line(event: Event) -> str | None:
    """A node drained, added or released, or the world resized; None for any other event."""
    if event.is_("drained"):
        return f"  drained {event['host']}: sres: {event['why']}"
    if event.is_("node-added"):
        job = f" job {event['job']}" if event.get("job") else ""
        return f"  added {event['host']} ({event['how']}{job}, {event['seconds']:.2f} s)"
    if event.is_("node-released") and event["why"] != "fault":  # a fault's node: "drained"
        return f"  released {event['host']} ({event['why']})"
    if event.is_("resize"):
        batch = (
            f", global batch {event['global_batch']}, lr x{event['lr_scale']:g}"
            if event.get("global_batch") is not None
            else ""
        )
        return (
            f"  resized {event['from_world']} -> {event['to_world']} ranks ({event['why']}) "
            f"after step {event['step']}: first step in {event['seconds']:.2f} s{batch}"
        )
    return None


def _recovered_line(rec: Event) -> str:
    return (
        f"  recovered gen {rec['generation']}: {rec['seconds']:.2f} s, from {rec['source']}, "
        f"resumed after step {rec['step']}, {rec['steps_lost']} step(s) redone, "
        f"{rec['bytes'] / 2**20:.1f} MiB moved"
    )
