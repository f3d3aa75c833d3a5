"""``sres run`` of the GPU suite's loop (``tests/gpu/train_cuda.py``) and what the tests read
of it: the examples' result files, and the device memory each entry into ``train`` saw."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.sres_runs import Run, clean_env, run_command, sres_command

MODULE = "tests.gpu.train_cuda"
ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    """The ranks find the suite's loop from the repository root; cuBLAS picks deterministic
    kernels (as a user asking for bitwise runs sets it)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return clean_env(PYTHONPATH=path, CUBLAS_WORKSPACE_CONFIG=":4096:8")


def cuda_run(
    tmp: Path, *args: str, steps: int, train_args: tuple[str, ...] = (), timeout: float = 150
) -> Run:
    """A run of one rank. ``timeout`` 150 s: each takes well under a minute on a GPU host, and a
    run that hangs must not eat a lent machine's few minutes."""
    log_dir = tmp / "run"
    cmd = sres_command(log_dir, 1, args, MODULE, steps, train_args, hang_timeout=30, reform_timeout=60)
    return run_command(cmd, env(), log_dir, timeout)


def result(run: Run, rank: int = 0) -> dict:
    return json.loads((run.log_dir / "out" / f"rank{rank}.json").read_text())


def memory(run: Run, rank: int = 0) -> list[dict]:
    """One line per entry into ``train`` (its first step), in order."""
    path = run.log_dir / "out" / f"memory{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def explain(run: Run) -> str:
    return f"rc {run.returncode}\n--- stderr\n{run.stderr[-4000:]}\n--- ranks\n{run.rank_logs()}"
