"""Tiered checkpoints: where each tier keeps a job's files, and their cleanup.

The RAM tier of job J on a node lives in ``$SRES_RAM_ROOT/job-J/`` (default root
``/dev/shm/sres``), so the prolog/epilog hooks and the ranks agree on it without talking.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

RAM_ROOT_ENV = "SRES_RAM_ROOT"
DEFAULT_RAM_ROOT = Path("/dev/shm/sres")


def ram_root() -> Path:
    return Path(os.environ.get(RAM_ROOT_ENV) or DEFAULT_RAM_ROOT)


def job_ram_dir(job_id: str, root: Path | None = None) -> Path:
    """The RAM-tier directory of one job on this node."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id or "") or job_id in (".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    return (root or ram_root()) / f"job-{job_id}"


def cleanup_job(job_id: str, root: Path | None = None) -> bool:
    """Remove a finished job's RAM-tier files on this node; True when something was removed."""
    path = job_ram_dir(job_id, root)
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
