"""How a recovery's control path grows with the job's ranks, from a measured curve (pure but for reading it).

A recovery's costs are measured on this machine at a few ranks; at thousands the control path
(kill -> fault decided -> new plan -> every survivor released into the new generation) costs more:
more liveness keys to scan, a larger plan, more ranks to release. ``benchmarks/control_plane.py``
measures that path at simulated scales and writes the curve shipped next to this module
(:data:`DEFAULT_CURVE`). Here the curve is read and validated (:func:`load_curve`: one
:class:`~launcher.errors.ConfigError` line for a malformed file), ``released_s`` is fitted as a
least-squares line ``a + b N`` over its points (:class:`LineFit`: a line, so that a scale beyond
the measured ones is extrapolated by the trend the points show, never by their last value), and
a scale is answered with the seconds, whether the curve measured, interpolated or extrapolated
them, and the growth per 1,000 ranks (:class:`ControlPathAt`), which ``sres simulate`` prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import UnionType
from typing import Any, Literal

import numpy

from launcher.errors import ConfigError

DEFAULT_CURVE = Path(__file__).with_name("control_plane_curve.json")
"""The curve measured on this project's development machine, shipped in the package."""

How = Literal["measured", "interpolated", "extrapolated"]


@dataclass(frozen=True)
class CurvePoint:
    """The control path of one recovery at one simulated scale, seconds from the kill."""

    ranks: int
    nodes: int
    detect_s: float
    """To the fault decided."""
    released_s: float
    """To every survivor released into the new generation: the whole control path."""
    barrier_s: float
    """The new generation's join barrier."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("ranks", "nodes"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{f.name} {value!r}: a whole number, at least 1")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{f.name} {value!r}: a number of seconds")
            elif value < 0:
                raise ValueError(f"{f.name} {value!r}: seconds, not negative")


@dataclass(frozen=True)
class LineFit:
    """``released_s = intercept_s + per_rank_s x ranks``, fitted by least squares."""

    intercept_s: float
    per_rank_s: float

    def at(self, ranks: float) -> float:
        """The line at ``ranks``, never below zero: a steep line fitted far from small scales
        crosses zero before a few ranks (64-1,024 ranks: -0.26 s at 0), and a negative cost at the
        measured scale would add more than the whole path to every recovery."""
        return max(0.0, self.intercept_s + self.per_rank_s * ranks)

    @property
    def growth_per_1000_s(self) -> float:
        return 1000 * self.per_rank_s

    def extra_s(self, ranks: int, measured_ranks: int) -> float:
        """What the control path costs at ``ranks`` beyond its cost at ``measured_ranks`` (the
        scale a recovery was measured at, which already holds that much): never below zero, so a
        curve that falls with scale never makes a larger job recover faster than measured."""
        return max(0.0, self.at(ranks) - self.at(measured_ranks))


@dataclass(frozen=True)
class ControlPathAt:
    """The control path at one scale, as ``sres simulate`` uses and prints it."""

    ranks: int
    seconds: float
    """The fitted line at ``ranks`` (at a measured point too: the model uses the line throughout)."""
    how: How
    low_ranks: int
    """The smallest and largest scales the curve measured."""
    high_ranks: int
    growth_per_1000_s: float


@dataclass(frozen=True)
class ControlCurve:
    """A measured curve: where and how it was measured, and its points sorted by ranks."""

    machine: str
    command: str
    """The command that measured it (and writes the file)."""
    measured: str
    """The date it was measured."""
    points: tuple[CurvePoint, ...]

    def __post_init__(self) -> None:
        if len(self.points) < 2:
            raise ValueError(f"{len(self.points)} point(s): a line needs at least two scales")
        ranks = [p.ranks for p in self.points]
        for before, after in zip(ranks, ranks[1:]):
            if after == before:
                raise ValueError(f"two points at {after} ranks: one point per scale")
            if after < before:
                raise ValueError(f"{after} ranks after {before}: points sorted by ranks")

    def fit(self) -> LineFit:
        """The least-squares line through ``released_s`` over ranks."""
        per_rank, intercept = numpy.polyfit(
            [float(p.ranks) for p in self.points], [p.released_s for p in self.points], 1
        )
        return LineFit(float(intercept), float(per_rank))

    def at(self, ranks: int) -> ControlPathAt:
        """The fitted seconds at ``ranks``, and whether the curve measured that scale, has it
        between two of its scales, or lies beyond them (below the first or above the last)."""
        low, high = self.points[0].ranks, self.points[-1].ranks
        how: How = "extrapolated"
        if any(p.ranks == ranks for p in self.points):
            how = "measured"
        elif low < ranks < high:
            how = "interpolated"
        line = self.fit()
        return ControlPathAt(ranks, line.at(ranks), how, low, high, line.growth_per_1000_s)


def parse_curve(data: object) -> ControlCurve:
    """A curve from the file's JSON value; ValueError naming the first thing wrong."""
    top = _fields(data, "the curve", {"machine": str, "command": str, "measured": str, "points": list})
    names: dict[str, type | UnionType] = {f.name: int | float for f in fields(CurvePoint)}
    points = []
    for i, item in enumerate(top["points"]):
        points.append(CurvePoint(**_fields(item, f"point {i}", names)))
    return ControlCurve(top["machine"], top["command"], top["measured"], tuple(points))


def _fields(data: object, what: str, types: Mapping[str, type | UnionType]) -> dict[str, Any]:
    """``data``'s values of these names, each checked to be of its type (the file is untrusted)."""
    if not isinstance(data, dict):
        raise ValueError(f"{what}: a JSON object, not {type(data).__name__}")
    missing = [name for name in types if name not in data]
    if missing:
        raise ValueError(f"{what}: no {', '.join(missing)}")
    for name, kind in types.items():
        if not isinstance(data[name], kind):
            raise ValueError(f"{what}: {name} {data[name]!r} is not a {getattr(kind, '__name__', 'number')}")
    return {name: data[name] for name in types}


def load_curve(path: Path) -> ControlCurve:
    """The curve in ``path``; a ConfigError naming the file and what is wrong with it."""
    try:
        return parse_curve(json.loads(path.read_text()))
    except OSError as err:
        raise ConfigError(f"control-path curve {path}: {err.strerror or err}") from None
    except ValueError as err:  # json.JSONDecodeError is one
        raise ConfigError(f"control-path curve {path}: {err}") from None
