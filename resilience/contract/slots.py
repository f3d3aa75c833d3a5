"""Slot names, spelled here only: which process of the run a name means.

A slot is a process's place in the run for its whole life, whichever rank a plan gives it:
plans map slots to ranks, and heartbeats, reports, logs (``ranks/<slot>.log``) and the
placement's processes are keyed by it. The supervisor makes the names; the ranks, the fork
servers and the batch producers only carry them. A name from elsewhere (a liveness datagram, a
child's log line) is checked against :data:`NAME` before it names a file or a key.
"""

from __future__ import annotations

import re
from typing import NewType

Slot = NewType("Slot", str)
"""A slot's name (``n0p1``): a ``str`` on the wire, in plans and in the environment."""

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What any slot name matches: no ``/`` or ``.``, so that a name is safe as a file name."""


def rank_slot(node: int, local: int) -> Slot:
    """The ``local``-th rank process of node ``node`` as first started (a spare node's too)."""
    return Slot(f"n{node}p{local}")


def respawn_slot(node: int, local: int, count: int) -> Slot:
    """A process started again in place of ``rank_slot(node, local)``; ``count`` keeps each new
    process's name apart from the dead one's (its late reports must not count as the new one's)."""
    return Slot(f"n{node}p{local}r{count}")


def standby_slot(node: int, count: int) -> Slot:
    """The ``count``-th warm standby started on node ``node``: no rank until a plan gives it one."""
    return Slot(f"n{node}s{count}")


def producer_slot(node: int) -> Slot:
    """Node ``node``'s batch producer (resilience.data): never a rank."""
    return Slot(f"n{node}b")


def fork_server_slot(node: int) -> Slot:
    """Node ``node``'s fork server (resilience.fork_server): never a rank."""
    return Slot(f"n{node}f")
