"""Events read back are as strict as events written: a name or field no event type declares is
our bug, raised where it is asked for, not a silently empty report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.observability.events import EventLog, read_events, summary
from launcher.observability.timeline import Event, Timeline


def _log(tmp_path: Path) -> Path:
    log = EventLog(tmp_path / "events.jsonl", wall=iter(range(100)).__next__)
    log.emit("fault", kind="kill", rank=1, node=0, host="h0", step=3, generation=1)
    log.emit("waiting", why="a spare", timeout_s=60.0, world_size=2)
    log.emit("fault", kind="exit 1", rank=2, node=1, host="h1", step=3, generation=1)
    log.close()
    with (tmp_path / "events.jsonl").open("a") as f:  # a newer writer's event: read as it is
        f.write(json.dumps({"event": "from-the-future", "t": 9.0, "x": 1}) + "\n")
    return tmp_path / "events.jsonl"


def test_events_are_found_by_declared_name(tmp_path: Path) -> None:
    events = read_events(_log(tmp_path))
    assert isinstance(events, Timeline) and len(events) == 4
    assert [e["rank"] for e in events.of("fault")] == [1, 2]
    assert events.count("fault") == 2 and events.count("recovered") == 0
    assert events.last("fault", "waiting")["kind"] == "exit 1"  # type: ignore[index]
    assert events.first("finished") is None
    assert events[1:].first("fault")["rank"] == 2  # type: ignore[index]
    assert events[3]["x"] == 1 and events[3].name == "from-the-future"


def test_a_misspelt_name_or_field_raises_where_it_is_asked_for(tmp_path: Path) -> None:
    events = read_events(_log(tmp_path))
    with pytest.raises(TypeError, match="no event type 'recoverd'"):
        events.of("recoverd")
    fault = events[0]
    with pytest.raises(TypeError, match="'fault' has no field 'ranks'"):
        fault["ranks"]
    with pytest.raises(TypeError, match="no event type has a field 'genration'"):
        fault.get("genration")
    assert fault.get("why") is None  # declared, optional, absent
    assert events[1].get("rank") is None  # another type's field: a scan may ask every event


def test_an_event_stays_a_dict_for_users_code(tmp_path: Path) -> None:
    """``job.events()`` hands these to users, who index, copy and serialise them."""
    fault = read_events(_log(tmp_path))[0]
    assert isinstance(fault, dict) and json.loads(json.dumps(fault)) == dict(fault)
    assert fault["event"] == "fault" and fault.t == 0.0
    assert Event(fault).is_("fault", "waiting")


def test_the_summary_reads_through_the_timeline(tmp_path: Path) -> None:
    text = summary(read_events(_log(tmp_path)))
    assert text.splitlines()[0] == "run did not finish"
    assert "fault: kill rank 1" in text and "fault: exit 1 rank 2" in text
