"""What a user checks of a run's goodput account (the ``finished`` event's ``goodput_by_cause``)."""

from __future__ import annotations

import json
from pathlib import Path


def assert_account_adds_up(log_dir: Path, straggler_injected: bool = False) -> dict[str, float]:
    """Every part non-negative, the parts summing to the run's wall time (its ``start`` to its
    ``finished`` event) within 1%, and no straggler time unless a slow node was injected."""
    events = [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
    start = [e for e in events if e["event"] == "start"][-1]
    finished = [e for e in events if e["event"] == "finished"][-1]
    parts = finished["goodput_by_cause"]
    assert min(parts.values()) >= 0, parts
    wall = finished["t"] - start["t"]
    assert abs(sum(parts.values()) - wall) <= 0.01 * wall, (sum(parts.values()), wall, parts)
    if not straggler_injected:
        assert parts["straggler"] == 0, parts
    return parts
