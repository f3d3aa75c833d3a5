"""The options of ``sres run`` and ``sres srun`` that say how a run is watched: live metrics and
stragglers (their reading is ``sres report``'s and the supervisor's; ``launcher.run.configs``
makes them a ``StragglerConfig``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.cli.arg_types import finite_float
from launcher.observability.straggler import ACTIONS, StragglerConfig


def add_run_arguments(p: argparse.ArgumentParser, d: Callable[[str], Any]) -> None:
    """``d``: an option's default, by its Python name (``RunOptions``')."""
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve live metrics (Prometheus text) on this port; 0 picks a free one (see the metrics event)",
    )
    p.add_argument(
        "--metrics-addr",
        default=d("metrics_addr"),
        help="address the metrics endpoint binds (default %(default)s: this host only)",
    )
    p.add_argument(
        "--metrics-textfile",
        type=Path,
        default=None,
        help="also write the metrics to this file, replaced atomically (node_exporter textfile collector)",
    )
    p.add_argument(
        "--straggler-factor",
        type=finite_float,
        default=StragglerConfig.factor,
        help="a rank computing this many times the median per step is slow (default %(default)g)",
    )
    p.add_argument(
        "--straggler-steps",
        type=int,
        default=StragglerConfig.steps,
        help="...for this many steps in a row: a straggler event (default %(default)d)",
    )
    p.add_argument(
        "--straggler-action",
        choices=ACTIONS,
        default="none",
        help="replace: treat a straggler's node as faulty (drained under Slurm) and move its ranks to a "
        "spare (default: report it)",
    )
