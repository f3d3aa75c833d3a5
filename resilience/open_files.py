"""Room for many connections: the soft limit on open files raised to the hard one.

A login's soft limit is often 1,024, while its hard one is far higher. Anyone on the network
can open connections to a run's ports, and a process past its soft limit fails every
``accept``, ``open`` and ``socket`` at once: about 1,100 idle connections to a rank's gloo port
ended both ranks (``accept: Too many open files``; gloo's listener is torch's, not ours to
budget), and the supervisor died of ``EMFILE``. Our own listeners bound what unproven
connections may hold (:mod:`resilience.contract.unproven`); this gives every process of the run
the headroom the system already allows.
"""

from __future__ import annotations

import resource

_WANTED = 1 << 20
"""Enough for any run; a hard limit of "unlimited" is not a value ``setrlimit`` takes as soft."""


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (capped); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _WANTED if hard == resource.RLIM_INFINITY else min(hard, _WANTED)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass  # a container that refuses: the limit stays, as before
    return soft
