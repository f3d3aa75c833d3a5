"""Every event the code writes is declared in launcher/observability/event_types.py.

An ast walk over launcher/ and resilience/ (nothing runs): each ``emit("name", ...)`` and
``store.events.push("name", ...)`` (a rank's, through the store's event channel; ``push_event`` where
it is passed on) names a declared event, with declared fields. The writer checks the
same at run time (the tests that run real supervisors go through it), for the fields spread
from a mapping that no reading of the source can see.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.observability.event_types import BY_NAME, COMMON, EVENT_TYPES, RANK, SUPERVISOR
from launcher.observability.events import EventLog, read_events

ROOT = Path(__file__).resolve().parents[2]
EMITTERS = ("emit", "push_event")
EVENT_CHANNELS = ("events", "_events")
"""Receivers of ``.push(...)`` that are the store's event channel (``store.events``, ``self._events``)."""
FORWARDERS = {
    ("launcher/supervisor/relay.py", "event.event"): "the ranks' events, declared where each rank writes it",
    ("resilience/tiers/agent.py", "event"): "TierAgent.emit: the tiers' events with the rank added",
}
"""Call sites whose event name is not a literal: they pass on an event written elsewhere."""


def _calls() -> list[tuple[str, int, ast.Call]]:
    found = []
    for package in ("launcher", "resilience"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                    if (name in EMITTERS or _pushed_to_channel(node.func)) and node.args:
                        found.append((str(path.relative_to(ROOT)), node.lineno, node))
    return found


def _pushed_to_channel(func: ast.Attribute | ast.Name) -> bool:
    if not (isinstance(func, ast.Attribute) and func.attr == "push"):
        return False
    receiver = func.value
    name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
    return name in EVENT_CHANNELS


def _literal_fields(call: ast.Call) -> set[str]:
    """The fields a call names: its keywords, and the constant keys of dicts it spreads
    (``**({"why": why} if why else {})``)."""
    names = {k.arg for k in call.keywords if k.arg is not None}
    for spread in (k.value for k in call.keywords if k.arg is None):
        for node in ast.walk(spread):
            if isinstance(node, ast.Dict):
                names |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return names


def test_every_emit_site_names_a_declared_event_with_declared_fields():
    calls = _calls()
    assert len(calls) > 25, "the walk found too few emit sites"
    undeclared, forwarders = [], set()
    for path, line, call in calls:
        first = call.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            forwarders.add((path, ast.unparse(first)))
            continue
        declared = BY_NAME.get(first.value)
        if declared is None:
            undeclared.append(f"{path}:{line}: {first.value!r} is not declared")
            continue
        allowed = {f.name for f in (*COMMON, *declared.fields)}
        if extra := _literal_fields(call) - allowed:
            undeclared.append(f"{path}:{line}: {first.value!r} has no field {sorted(extra)}")
    assert undeclared == [], "declare them in launcher/observability/event_types.py"
    assert forwarders == set(FORWARDERS), "a new emit whose event name is not a literal"


def test_every_declared_event_is_written_somewhere():
    written = {c.args[0].value for _, _, c in _calls() if isinstance(c.args[0], ast.Constant)}
    assert sorted(set(BY_NAME) - written) == [], "declared but never written: remove it, or write it"


def test_the_definitions_are_well_formed():
    assert len(BY_NAME) == len(EVENT_TYPES)
    common = {f.name for f in COMMON}
    for e in EVENT_TYPES:
        names = [f.name for f in e.fields]
        assert len(names) == len(set(names)), e.name
        assert not common & set(names), e.name
        assert e.source in (SUPERVISOR, RANK) and e.meaning and all(f.meaning and f.type for f in e.fields)


def test_the_writer_refuses_an_undeclared_event_or_field_and_a_missing_one(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", wall=lambda: 5.0)
    log.emit("flushed", step=3, tier="persistent")
    log.emit("tier-resumed", rank=0, tier="ram", step=4, t=1.0)  # a rank's event keeps its time
    with pytest.raises(TypeError, match="'flushd' is not declared"):
        log.emit("flushd", step=3, tier="persistent")
    with pytest.raises(TypeError, match="'flushed' has no field tiers"):
        log.emit("flushed", step=3, tiers="persistent")
    with pytest.raises(TypeError, match="'flushed' lacks tier"):
        log.emit("flushed", step=3)
    log.emit("node-released", node=1, host="gpu1", why="request")  # its optional fields left out
    log.close()
    lines = read_events(tmp_path / "events.jsonl")
    assert [(e["event"], e["t"]) for e in lines] == [
        ("flushed", 5.0),
        ("tier-resumed", 1.0),
        ("node-released", 5.0),
    ]
