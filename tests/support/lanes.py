"""The two CI lanes, balanced from measured times instead of by hand.

The suite runs as two xdist workers side by side (tests/run.sh), and takes as long as its longer
lane. Slurm tests are pinned to one lane (tests/conftest.py says why); every other test of a real
process may run in either, and goes where it evens the two out. Each test's time comes from
``tests/durations.json``, written by a run with ``--store-durations`` (``./tests/run.sh
--store-durations`` on a CI-sized machine): a test nobody measured yet counts as
:data:`UNMEASURED_S` until then. A file's tests stay together, so that its module fixtures are
built once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNMEASURED_S = 20.0
"""What a test with no measured time counts for: about the median of the local tests."""

RECORDED: defaultdict[str, float] = defaultdict(float)
"""nodeid -> seconds (setup, call and teardown) of the tests that ran in a lane in this session."""


@dataclass(frozen=True)
class Plan:
    lane_of: Mapping[str, str]
    """nodeid -> lane, for every test that runs in one (unit tests run in either, ungrouped)."""
    seconds: Mapping[str, float]
    """lane -> the time its tests were measured at."""


def balance(
    pinned: Mapping[str, str],
    movable: Iterable[tuple[str, str]],
    durations: Mapping[str, float],
    lanes: tuple[str, ...],
) -> Plan:
    """Pinned tests stay in their lane; the movable ones (nodeid, file) go file by file, longest
    first, to the lane with the least time so far (LPT: within 4/3 of the best split). Ties go to
    the first lane by name: every xdist worker computes the same plan."""

    def cost(nodeid: str) -> float:
        return durations.get(nodeid, UNMEASURED_S)

    seconds = dict.fromkeys(lanes, 0.0)
    lane_of = dict(pinned)
    for nodeid, lane in pinned.items():
        seconds[lane] += cost(nodeid)
    files: dict[str, list[str]] = defaultdict(list)
    for nodeid, file in movable:
        files[file].append(nodeid)
    for file in sorted(files, key=lambda f: (-sum(map(cost, files[f])), f)):
        lane = min(lanes, key=lambda name: (seconds[name], name))
        for nodeid in files[file]:
            lane_of[nodeid] = lane
            seconds[lane] += cost(nodeid)
    return Plan(lane_of, seconds)


def load(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def store(recorded: Mapping[str, float], path: Path = DURATIONS) -> None:
    """Merges this session's times into the file: a partial run updates what it ran."""
    merged = {**load(path), **{k: round(v, 1) for k, v in recorded.items()}}
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
