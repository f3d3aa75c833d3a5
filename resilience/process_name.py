"""A process of the run names itself after its slot (``ps``, ``top``, ``/proc/PID/comm``).

A rank forked from its machine's fork server keeps the server's environment in
``/proc/PID/environ`` (the kernel shows the block a process was exec'ed with, and a fork execs
nothing): ``SRES_SLOT`` there says ``n0f`` for the server and every rank it forked. The name is
what tells them apart, for an operator reading ``ps -o pid,comm`` and for anything that must
find one slot's process (the tests' kills). Linux keeps 15 bytes of it; slot names are shorter.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

PR_SET_NAME = 15
LIMIT = 15
"""Bytes of a name Linux keeps (``TASK_COMM_LEN`` less its terminating zero)."""


def name_process(name: str) -> None:
    """Give this process (its calling thread: call it from the main thread) ``name``."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:LIMIT], 0, 0, 0)


def name_of(pid: int) -> str | None:
    """A process's name, None once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    except OSError:
        return None


def names(name: str) -> str:
    """What ``name_of`` reads for a process named ``name``."""
    return name.encode()[:LIMIT].decode(errors="ignore")
