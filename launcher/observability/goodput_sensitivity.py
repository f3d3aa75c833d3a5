"""Which input moves our goodput most: a tornado table of the goodput model (pure).

Each input is halved and doubled in turn, the others held, and the model's closed form
(:func:`~launcher.observability.goodput_model.expected`) is evaluated at both: deterministic and
instant, where Monte-Carlo noise would blur small swings. An input at zero is taken from zero to
a stated plausible value instead (one step lost, 1% of overhead). The rows come largest swing
first: the roadmap's order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.observability.goodput_model import FaultMix, SimulatedJob, expected
from launcher.observability.goodput_strategies import Ladder

FROM_ZERO = {"lost_steps": 1.0, "steady_overhead": 0.01, "same_domain": 0.5}
"""An input at zero varies from 0 to this instead of by a factor."""
CAPPED = {"steady_overhead": 0.5, "same_domain": 1.0}
"""Shares: never past this."""
JOB_INPUTS = ("failures_per_node_hour", "step_s")
LADDER_INPUTS = tuple(
    f.name for f in dataclasses.fields(Ladder) if isinstance(getattr(Ladder(), f.name), float)
)
"""The ladder's times and shares (not its name, switches, counts or the control path's curve)."""


@dataclass(frozen=True)
class Swing:
    name: str
    low: float
    high: float
    goodput_low: float
    """Goodput with the input at ``low``."""
    goodput_high: float

    @property
    def swing(self) -> float:
        return abs(self.goodput_high - self.goodput_low)


def _range(name: str, value: float, factor: float) -> tuple[float, float]:
    if value == 0:
        return 0.0, FROM_ZERO.get(name, 0.0)
    return value / factor, min(value * factor, CAPPED.get(name, float("inf")))


def tornado(ladder: Ladder, job: SimulatedJob, mix: FaultMix, factor: float = 2.0) -> list[Swing]:
    """Every input of ``job`` (failure rate, step time) and ``ladder`` at ``/factor`` and ``x factor``."""
    rows = []
    for name in JOB_INPUTS + LADDER_INPUTS + ("spares",):
        on_job = name in JOB_INPUTS
        if name == "spares":
            pool = ladder.pool(job)
            low, high = float(max(0, pool // 2)), float(pool * 2)
        else:
            low, high = _range(name, getattr(job if on_job else ladder, name), factor)
        goodputs = []
        for value in (low, high):
            value = int(value) if name == "spares" else value
            varied_job = dataclasses.replace(job, **{name: value}) if on_job else job
            varied = ladder if on_job else dataclasses.replace(ladder, **{name: value})
            goodputs.append(expected(varied, varied_job, mix))
        rows.append(Swing(name, low, high, goodputs[0], goodputs[1]))
    return sorted(rows, key=lambda r: r.swing, reverse=True)
