"""A git worktree of an earlier commit, for benchmarks that compare the code before a change
with the code after it in one run, interleaved (this machine is shared and noisy)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def worktree(ref: str, where: Path) -> Iterator[Path]:
    """``ref`` checked out at ``where`` (removed again afterwards)."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(where), ref], check=True, capture_output=True, cwd=ROOT
    )
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)
