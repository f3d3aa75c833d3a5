"""Whether a node's slurmd answers, and if not, whether the node itself does: a dead slurmd and
a node cut off from the network read apart (the drain reason says which)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping

from launcher.errors import SlurmError

ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"


def slurmd_reach(address: str, port: int, timeout_s: float = 1.0) -> str:
    """How the node's slurmd port answers a connection: it accepts (``answers``); the node's
    kernel refuses it at once (``refused``: the node is up, its slurmd is not); nothing comes back
    (``silent``: the node is cut off or powered off; what runs on it may still be alive). Either
    failure is seen seconds before slurmctld marks the node not responding (SlurmdTimeout). The
    slurmd port itself, not another: a site's firewall lets slurmctld's connections through."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return ANSWERS
    except ConnectionRefusedError:
        return REFUSED
    except OSError:  # timed out, no route (an ARP that no one answers)
        return SILENT


SLURM_SILENT_S = 30.0
"""After slurmctld failed to answer about a node, how long the evidence of other nodes is taken
from their probes alone: each question costs scontrol's retries (10-30 s)."""


class NodeProbe:
    """Where each node's slurmd listens (as Slurm said at the start, and at each answer since), and
    whether slurmctld has been silent lately. When it is, the probe still goes to the address
    Slurm gave before: a supervisor whose own link is cut then finds every other node silent,
    not merely unknown to a Slurm it cannot reach."""

    def __init__(
        self,
        known: Mapping[str, tuple[str, int]],
        probe: Callable[[str, int], str] = slurmd_reach,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._at, self.probe, self.clock = dict(known), probe, clock
        self._silent_until, self._silent_why = 0.0, ""

    def slurm_answers(self) -> bool:
        """False for a while after slurmctld did not answer: do not ask it again yet."""
        return self.clock() >= self._silent_until

    def check_slurm(self) -> None:
        """Raise what slurmctld's last silence said, while it lasts."""
        if not self.slurm_answers():
            raise SlurmError(self._silent_why)

    def slurm_failed(self, err: SlurmError) -> None:
        if self.slurm_answers():
            self._silent_until, self._silent_why = self.clock() + SLURM_SILENT_S, str(err)

    def reach(self, name: str, address: str = "", port: int = 0) -> str:
        """Probe ``name``'s slurmd: at ``address:port`` (Slurm's answer now, remembered), else where
        it was last known to listen; a node never known is taken as answering refused."""
        if port:
            self._at[name] = (address or name, port)
        known = self._at.get(name)
        return self.probe(*known) if known else REFUSED
