"""events.jsonl: one JSON object per line, the timeline of a run.

Every fault, re-formation and recovery is an event with a wall-clock ``t``, so that the
timeline of a fault can be rebuilt and measured after the fact (tests and benchmarks read
this file, never the console).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.wall = wall
        self._file = self.path.open("a", buffering=1)
        self.events: list[dict[str, Any]] = []
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with each record once it is written (live metrics)."""
        self._lock = threading.Lock()  # Supervisor.flush_persistent may emit from another thread

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, **fields}
        record.setdefault("t", self.wall())
        with self._lock:
            self._file.write(json.dumps(record, sort_keys=False) + "\n")
            self.events.append(record)
            for listener in self.listeners:
                listener(record)
        return record

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summary(events: list[dict[str, Any]]) -> str:
    """The short human summary ``sres run`` prints at the end."""
    faults = [e for e in events if e["event"] == "fault"]
    recovered = [e for e in events if e["event"] == "recovered"]
    end = next((e for e in reversed(events) if e["event"] in ("finished", "failed")), None)
    lines = []
    if end is None:
        lines.append("run did not finish")
    elif end["event"] == "failed":
        lines.append(f"run FAILED: {end['reason']}")
    else:
        goodput = end.get("goodput")
        lines.append(
            f"run finished: {end['steps']} steps, {len(faults)} fault(s), goodput {goodput:.1%}"
            if goodput is not None
            else f"run finished: {end['steps']} steps"
        )
        causes = end.get("goodput_by_cause") or {}
        if causes:
            spent = ", ".join(
                f"{k.replace('_', ' ')} {v:.2f} s" for k, v in causes.items() if abs(v) >= 0.005
            )
            lines.append(f"  wall {sum(causes.values()):.2f} s: {spent}")
    for fault in faults:
        where = f"rank {fault['rank']}" if fault.get("rank") is not None else f"node {fault.get('node')}"
        why = f": {fault['why']}" if fault.get("why") else ""
        lines.append(
            f"  fault: {fault['kind']} {where} (node {fault.get('host', fault.get('node'))}{why}) "
            f"at step {fault.get('step')}"
        )
    for event in events:
        if event["event"] == "drained":
            lines.append(f"  drained {event['host']}: sres: {event['why']}")
        elif event["event"] == "node-added":
            job = f" job {event['job']}" if event.get("job") else ""
            lines.append(f"  added {event['host']} ({event['how']}{job}, {event['seconds']:.2f} s)")
        elif event["event"] == "node-released" and event["why"] != "fault":  # a fault's node: "drained" above
            lines.append(f"  released {event['host']} ({event['why']})")
        elif event["event"] == "resize":
            batch = (
                f", global batch {event['global_batch']}, lr x{event['lr_scale']:g}"
                if event.get("global_batch") is not None
                else ""
            )
            lines.append(
                f"  resized {event['from_world']} -> {event['to_world']} ranks ({event['why']}) "
                f"after step {event['step']}: first step in {event['seconds']:.2f} s{batch}"
            )
    for rec in recovered:
        lines.append(
            f"  recovered gen {rec['generation']}: {rec['seconds']:.2f} s, from {rec['source']}, "
            f"resumed after step {rec['step']}, {rec['steps_lost']} step(s) redone, "
            f"{rec['bytes'] / 2**20:.1f} MiB moved"
        )
    return "\n".join(lines)
