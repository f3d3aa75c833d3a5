"""Fixed-point gradient sums: the arithmetic behind ``resilience.ddp(model, exact=True)``.

Floating-point addition is not associative, so a step's summed gradient depends on how the
global batch was split across ranks and micro-steps: a world that changes size (or a DDP
rebuilt after a fault) changes the last bits of every parameter. Integer addition is
associative. Each micro-batch's gradient is therefore turned into integers at a resolution
that depends only on that micro-batch's own gradient (``BITS`` binary digits below the
largest element of the tensor), integers of different resolutions are aligned by exact
left shifts, and everything is summed in int64, locally and across ranks. The integer sum,
and so the gradient handed to the optimizer, is a function of the step's micro-batches
alone.

Numerical meaning, per tensor and micro-batch: an element is kept to a unit of
``2**(e - BITS)`` where ``2**e`` bounds the largest element, so with 32 bits every element
within 2**-8 of the largest is exact and the rest are rounded to 2**-32 of the largest
(float32 keeps 24 bits per element). The int64 sum holds ``SUM_BITS`` bits: the span between
the largest and the finest micro-batch of a step, plus log2 of the number of micro-batches,
must fit in ``SUM_BITS - BITS`` (30 bits at the default: a spread of 2**24 with 64
micro-batches). A step that does not fit, or whose gradient holds inf or NaN, is not
representable: :func:`plan_sum` says so, and the caller raises or skips the step, the same on
every rank. Pure functions; no communication here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BITS = 32
"""Binary digits kept below the largest element of each micro-batch's gradient, per tensor."""
SUM_BITS = 62
"""Magnitude bits of the int64 sums (one below the sign bit, so a sum can never wrap)."""
EMPTY = -(1 << 40)
"""Header value of a tensor with no non-zero gradient yet (below every real exponent)."""
OK, RANGE, NONFINITE = 0, 1, 2
"""Problems of a tensor's sum, ordered by gravity (the all-reduce keeps the worst)."""


def exponent(max_abs: float) -> int | None:
    """The smallest ``e`` with ``max_abs < 2**e``; None for zero (nothing to add)."""
    return None if max_abs == 0 else math.frexp(max_abs)[1]


def fits(high: int, low: int, count: int) -> bool:
    """Whether ``count`` values below ``2**high``, in units of ``2**low``, sum in int64."""
    return high - low + max(0, math.ceil(math.log2(max(count, 1)))) <= SUM_BITS


def quantize(grad: torch.Tensor, low: int) -> torch.Tensor:
    """``round(grad / 2**low)`` as int64: scaling by a power of two is exact, rounding is
    half-to-even, so the integers are a function of ``grad`` and ``low`` only."""
    x = grad.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # half and bfloat16 convert exactly
    if x.dtype == torch.float32 and abs(low) > 126:
        x = x.double()  # 2**-low is not a normal float32
    scaled = x * (2.0 ** -low)
    return scaled.round_().to(torch.int64)


def dequantize(total: torch.Tensor, low: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean of ``count`` micro-batch gradients whose integer sum is ``total`` in units of
    ``2**low``: the same integers give the same bits."""
    return (total.double() * (2.0 ** low)).div_(count).to(dtype)


@dataclass
class Slot:
    """One tensor's integer sum over this rank's micro-batches of the current step."""

    total: torch.Tensor
    """int64, the tensor's shape; a view into the buffer that is all-reduced."""
    low: int | None = None
    """Exponent of one unit of ``total``; None while nothing non-zero was added."""
    high: int | None = None
    """Bound (as an exponent) of the largest element of any micro-batch added."""
    problem: int = OK
    seen: bool = False
    """Whether any micro-batch produced a gradient for this tensor (even an all-zero one)."""

    def add(self, grad: torch.Tensor, max_abs: float, count: int, bits: int = BITS) -> None:
        """Add one micro-batch's gradient (``max_abs`` its largest magnitude); ``count`` is
        the number of micro-batches of this rank so far, this one included."""
        self.seen = True
        if not math.isfinite(max_abs):
            self.problem = NONFINITE
        e = exponent(max_abs)
        if self.problem or e is None:
            return
        unit = e - bits
        low = unit if self.low is None else min(self.low, unit)
        high = e if self.high is None else max(self.high, e)
        if not fits(high, low, count):
            self.problem = RANGE
            return
        if self.low is not None and low < self.low:
            self.total.mul_(1 << (self.low - low))
        q = quantize(grad, unit)
        if unit > low:
            q.mul_(1 << (unit - low))
        self.total.add_(q.view_as(self.total))
        self.low, self.high = low, high

    def header(self) -> list[int]:
        """What the all-reduce (MAX) of the step needs: largest exponent, minus the finest
        unit, the worst problem, whether seen."""
        if self.low is None:
            return [EMPTY, EMPTY, self.problem, int(self.seen)]
        return [self.high, -self.low, self.problem, int(self.seen)]

    def align(self, low: int) -> None:
        """Express ``total`` in units of ``2**low`` (the finest of every rank); exact, as
        :func:`plan_sum` checked that it fits."""
        if self.low is not None and self.low > low:
            self.total.mul_(1 << (self.low - low))
        self.low = low

    def reset(self) -> None:
        self.low = self.high = None
        self.problem, self.seen = OK, False


@dataclass(frozen=True)
class SumPlan:
    """What every rank concludes from the MAX-reduced headers of a step (the same everywhere)."""

    lows: tuple[int | None, ...]
    """Common unit exponent of each tensor; None for a tensor with no non-zero gradient."""
    seen: tuple[bool, ...]
    problem: int
    culprit: int | None
    """Index of the first tensor with the worst problem."""


def plan_sum(headers: list[list[int]], bound_count: int) -> SumPlan:
    """Decide a step from the reduced headers. ``bound_count`` bounds the number of
    micro-batches of the step (world size times the most any rank did). Pure."""
    lows: list[int | None] = []
    problems: list[int] = []
    for high, minus_low, problem, _ in headers:
        if high == EMPTY:
            lows.append(None)
            problems.append(problem)
            continue
        low = -minus_low
        lows.append(low)
        problems.append(problem or (OK if fits(high, low, bound_count) else RANGE))
    worst = max(problems, default=OK)
    culprit = problems.index(worst) if worst else None
    return SumPlan(tuple(lows), tuple(bool(h[3]) for h in headers), worst, culprit)
