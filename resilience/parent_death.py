"""Linux's parent-death signal: a process of the run never outlives the one that started it.

An out-of-memory kill or a SIGKILL of a parent runs none of its clean-up, so its children must
notice by themselves; the kernel delivers the signal asked for here when the parent goes. The
signal follows the *thread* that forked, not the process: a child started from a thread that
later exits would be killed with it, so callers ask only from the main thread.

Rank processes, fork servers and batch producers ask for SIGKILL when their supervisor dies;
a ``ResilientExecutor`` job's process asks for SIGINT when submitit's controller dies, so that it
stops its ranks as a cancel does. Standard library only: the launcher imports it too.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int]:
    return ctypes.CDLL(None, use_errno=True).prctl


def ask(signum: int) -> None:
    """This process gets ``signum`` when its parent (the thread that started it) ends."""
    _prctl()(PR_SET_PDEATHSIG, signum)


def before_exec(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` that gives the child SIGKILL when ``parent`` dies. ``prctl`` is looked up
    here, before the fork, so the child calls it without loading anything."""
    prctl = _prctl()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was asked for
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
