"""The run report's pictures (matplotlib, Agg: no display needed). Each function writes one PNG."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from launcher.observability.timeline import Timeline  # noqa: E402

MARKS = {
    "fault": ("tab:red", "fault"),
    "recovered": ("tab:green", "recovered"),
    "resize": ("tab:purple", "resize"),
    "requeue": ("black", "requeue"),
}
CAUSE_COLOURS = {
    "productive": "tab:green",
    "startup": "tab:gray",
    "detection": "tab:red",
    "reform": "tab:orange",
    "transfer": "tab:blue",
    "first_step": "tab:cyan",
    "redone": "tab:pink",
    "resize": "tab:purple",
    "other": "lightgray",
}


def timeline(path: Path, start_t: float, steps: Sequence[Mapping[str, Any]], events: Timeline) -> None:
    """Step time over wall time (each step's slowest rank), faults, recoveries, resizes and saves marked."""
    per_step: dict[tuple[int, int], tuple[float, float]] = {}
    for s in steps:
        key = (s["generation"], s["step"])
        t, w = per_step.get(key, (0.0, 0.0))
        per_step[key] = (max(t, s["t"]), max(w, s["step_s"] / s.get("steps", 1)))  # per step
    fig, ax = plt.subplots(figsize=(9, 3.6))
    points = sorted((t - start_t, w * 1000) for t, w in per_step.values())
    top = y_top([ms for _, ms in points])
    if points:
        ax.plot(*zip(*[p for p in points if top is None or p[1] <= top]), ".", markersize=3,
                color="tab:blue", label="step time (slowest rank)")  # fmt: skip
    spikes = [p for p in points if top is not None and p[1] > top]
    if spikes:  # above the axis: drawn at its top, with their times, so steady steps stay readable
        ax.plot([t for t, _ in spikes], [top] * len(spikes), "^", color="tab:red", markersize=5,
                label=f"slower than {top:,.0f} ms")  # fmt: skip
        for t, ms in spikes[:12]:
            ax.annotate(f"{ms:,.0f} ms", (t, top), textcoords="offset points", xytext=(2, -10), fontsize=7)
    seen = set()
    for e in events.of(*MARKS):
        colour, label = MARKS[e.name]
        ax.axvline(e.t - start_t, color=colour, alpha=0.7, lw=1.2, label=None if label in seen else label)
        seen.add(label)
    saves = [e.t - start_t for e in events.of("checkpoint-saved")]
    if saves:
        ax.plot(saves, [0] * len(saves), "|", color="tab:gray", markersize=8, label="checkpoint saved")
    ax.set_xlabel("wall time since start (s)")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0, top=top * 1.08 if top is not None else None)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    _save(fig, path)


SPIKE = 3.0
"""A step slower than this many medians is a spike (a recovery's first step, a save)."""


def y_top(values_ms: Sequence[float]) -> float | None:
    """Where the step-time axis ends: at ``SPIKE`` medians when slower steps exist, so one
    recovery's 5,000 ms step does not flatten 60 ms steps into the axis; None: every step fits."""
    if not values_ms:
        return None
    ordered = sorted(values_ms)
    top = SPIKE * ordered[len(ordered) // 2]
    return top if ordered[-1] > top and top > 0 else None


def goodput_bar(path: Path, causes: Mapping[str, float]) -> None:
    """One bar: the run's wall time split by cause."""
    total = sum(max(0.0, v) for v in causes.values()) or 1.0
    fig, ax = plt.subplots(figsize=(9, 2.2))
    left = 0.0
    for cause, seconds in causes.items():
        if seconds <= 0:
            continue
        ax.barh(
            0,
            seconds / total * 100,
            left=left,
            color=CAUSE_COLOURS.get(cause, "tab:olive"),
            label=f"{cause} {seconds:.2f} s",
        )
        left += seconds / total * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_title("share of wall time (%)", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, fontsize=8, frameon=False)
    _save(fig, path)


MAX_ROWS, MAX_COLUMNS = 64, 400
"""The heatmap's most rows and columns. A row a rank made the picture 0.35 inch a rank tall (a
1,400-inch PNG at 4,096 ranks) and its grid a float per rank and step (40 million at 4,096 ranks
and 10,000 steps); past these, neighbouring ranks and steps share a cell."""


@dataclass(frozen=True)
class HeatGrid:
    """Compute time per step (ms), a row per rank or run of neighbouring ranks, a column per step
    or run of steps. A cell holds the slowest of what it covers, so a straggler stays bright when
    its row is shared; NaN where no rank of the row reported a step of the column."""

    values: np.ndarray
    ranks: list[tuple[int, int]]
    """Each row's first and last rank."""
    steps: list[tuple[int, int]]
    """Each column's first and last step."""


def _spans(items: Sequence[int], most: int) -> tuple[list[tuple[int, int]], int]:
    """``items`` (sorted) cut into at most ``most`` runs of equal length; and that length."""
    width = max(1, math.ceil(len(items) / most))
    return [(items[i], items[min(i + width, len(items)) - 1]) for i in range(0, len(items), width)], width


def heat_grid(
    steps: Sequence[Mapping[str, Any]], max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS
) -> HeatGrid:
    """The grid of ``steps`` (step reports: rank, step, compute_s over ``steps`` steps), no larger
    than ``max_rows`` x ``max_columns`` however many ranks and steps reported."""
    if max_rows < 1 or max_columns < 1:
        raise ValueError(f"a grid needs a row and a column (got {max_rows} x {max_columns})")
    ranks = sorted({s["rank"] for s in steps})
    numbers = sorted({s["step"] for s in steps})
    row_spans, per_row = _spans(ranks, max_rows)
    column_spans, per_column = _spans(numbers, max_columns)
    row = {r: i // per_row for i, r in enumerate(ranks)}
    column = {n: i // per_column for i, n in enumerate(numbers)}
    values = np.full((len(row_spans), len(column_spans)), np.nan)
    if steps:
        at = (np.array([row[s["rank"]] for s in steps]), np.array([column[s["step"]] for s in steps]))
        ms = np.array([s["compute_s"] / s.get("steps", 1) * 1000 for s in steps])  # per step
        np.fmax.at(values, at, ms)
    return HeatGrid(values, row_spans, column_spans)


def heatmap(path: Path, steps: Sequence[Mapping[str, Any]]) -> None:
    """Compute time per rank and step (ms): a straggler is a bright row."""
    grid = heat_grid(steps)
    rows = len(grid.ranks)
    shared = any(first != last for first, last in grid.ranks)  # neighbouring ranks share a row
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * min(rows, 16) + 0.1 * max(0, rows - 16)))
    if grid.ranks and grid.steps:
        image = ax.imshow(
            grid.values,
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            extent=(grid.steps[0][0] - 0.5, grid.steps[-1][1] + 0.5, rows - 0.5, -0.5),
        )
        binned = shared or any(first != last for first, last in grid.steps)
        fig.colorbar(image, ax=ax, label="compute (ms)" + (", slowest of the cell" if binned else ""))
        every = max(1, math.ceil(rows / 32))  # at most 32 labels
        labels = [str(a) if a == b else f"{a}-{b}" for a, b in grid.ranks]
        ax.set_yticks(range(0, rows, every), labels[::every], fontsize=8 if shared else None)
    ax.set_xlabel("step")
    ax.set_ylabel("ranks" if shared else "rank")
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
