"""The ``sres`` a user runs: the console script pip installed, end to end.

Every other test starts ``python -m launcher.entry`` or ``-m launcher.cli``; this one runs the
file in the environment's ``bin/`` (entry point ``launcher.entry:main``, which latches the
requeue signal before anything heavy is imported), so a broken entry point or package data
that only the installed script meets fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.observability.events import read_events


def _installed_sres() -> Path:
    script = Path(sys.executable).parent / "sres"
    assert script.is_file(), f"no console script at {script}: install the package (pip install -e .)"
    assert "launcher.entry" in script.read_text(), f"{script} is not this project's sres"
    return script


def test_the_installed_sres_recovers_a_node_loss_end_to_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
    log_dir, out = tmp_path / "run", tmp_path / "out"
    done = subprocess.run(
        [
            str(_installed_sres()),
            "run",
            "--nodes",
            "2",
            "--spares",
            "1",
            "--inject",
            "node:1:step=5",
            "--log-dir",
            str(log_dir),
            "--",
            sys.executable,
            "-m",
            "resilience.examples.train_mlp",
            "--steps",
            "12",
            "--width",
            "64",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,  # not the repository: the installed package is what runs
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_events(log_dir / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert "recovered" in kinds and kinds[-1] == "finished", kinds
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["step"] for r in ranks] == [11, 11] and len({r["digest"] for r in ranks}) == 1, ranks
