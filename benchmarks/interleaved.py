"""Two ways of running the same thing, interleaved run by run, and the table of their medians:
what the A/B benchmarks share (a slow minute of the machine then hits both sides alike)."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

Measures = dict[str, float]


def interleave(
    modes: tuple[str, str], repeat: int, one_run: Callable[[Path, str], Measures], prefix: str
) -> dict[str, list[Measures]]:
    """``one_run(work_dir, mode)`` ``repeat`` times for each mode, alternating; each run printed."""
    runs: dict[str, list[Measures]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for i in range(repeat):
            for mode in modes:
                runs[mode].append(one_run(Path(tmp), mode))
                print(f"repeat {i + 1}/{repeat} {mode}: {runs[mode][-1]}", flush=True)
    return runs


def table(runs: dict[str, list[Measures]], measures: Sequence[str], digits: int = 2) -> str:
    """Markdown: each measure's median on both sides, and the second over the first."""
    first, second = runs
    repeat = len(runs[first])
    lines = [
        f"| seconds, median of {repeat} | {first} | {second} | {second} / {first} |",
        "|---|---|---|---|",
    ]
    for measure in measures:
        a, b = (statistics.median(r[measure] for r in runs[mode]) for mode in (first, second))
        ratio = f"{b / a:.2f}x" if a else "-"  # nothing on the first side (0 steps redone)
        lines.append(f"| {measure} | {a:.{digits}f} | {b:.{digits}f} | {ratio} |")
    return "\n".join(lines)
