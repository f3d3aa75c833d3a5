"""The report's compute heatmap at scale: a bounded grid and picture whatever the ranks and steps,
and a straggler still bright when its row is shared (launcher/observability/report_plots.py)."""

from __future__ import annotations

import math

import matplotlib.image

from launcher.observability import report_plots
from launcher.observability.report_plots import heat_grid


def _report(rank: int, step: int, ms: float, steps: int = 1) -> dict:
    return {"rank": rank, "step": step, "compute_s": ms / 1000 * steps, "steps": steps}


def test_a_small_run_has_a_row_a_rank_and_a_column_a_step():
    grid = heat_grid([_report(r, n, 10 + r) for r in range(3) for n in range(4) if (r, n) != (2, 3)])
    assert grid.ranks == [(0, 0), (1, 1), (2, 2)] and grid.steps == [(n, n) for n in range(4)]
    assert grid.values[1, 2] == 11 and math.isnan(grid.values[2, 3])  # rank 2 never reported step 3


def test_4096_ranks_share_64_rows_and_the_straggler_stays_bright():
    steps = [_report(r, n, 200 if r == 1234 else 50, steps=5) for r in range(4096) for n in (0, 5, 10)]
    grid = heat_grid(steps)
    assert grid.values.shape == (64, 3)
    assert grid.ranks[19] == (1216, 1279) and set(grid.values[19]) == {200}
    assert {float(v) for i, row in enumerate(grid.values) if i != 19 for v in row} == {50}


def test_10000_steps_share_at_most_400_columns():
    grid = heat_grid([_report(r, n, 50) for r in range(2) for n in range(10_000)])
    assert grid.values.shape == (2, 400) and grid.steps[0] == (0, 24) and grid.steps[-1] == (9975, 9999)


def test_the_picture_of_4096_ranks_stays_a_page_tall(tmp_path):
    path = tmp_path / "ranks.png"
    report_plots.heatmap(path, [_report(r, n, 50 + r % 7) for r in range(4096) for n in range(3)])
    height, width, _ = matplotlib.image.imread(path).shape
    assert height <= 1200 and width == 900, (height, width)
