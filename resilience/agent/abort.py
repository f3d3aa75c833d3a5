"""Releasing a rank that is blocked in a collective whose peer is gone.

With gloo, a collective blocked on a live peer is released only when that peer's connection
fails; a peer that tears its group down does not close its connections while anything (a DDP
Reducer does) still references the group, and ``ProcessGroup.abort()`` does not release a
waiting gloo collective either (all three checked with torch 2.13, see the project notes).
So we shut down, at the socket level, the *connected* TCP sockets that the generation's
groups opened (never the listening ones: gloo's listener terminates the process if its
socket fails). The blocked receive fails at once, the collective raises, and the rank goes
on to the next generation. With NCCL, ``abort()`` on the group is the supported way.
"""

from __future__ import annotations

import os
import socket
import stat

import torch.distributed as dist


def socket_inodes() -> dict[int, int]:
    """inode -> fd of every socket this process has open."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[st.st_ino] = int(name)
    return out


class GroupSockets:
    """The sockets a generation opened: from :meth:`__enter__` (its formation) on.

    That includes the groups ``train`` creates itself (a device mesh's groups: HSDP's replica
    groups, ``new_group``), whose collectives block as the default group's do; a rank blocked in
    one of them is released too. Other sockets ``train`` opened in the generation are shut down
    as well: its end abandons that ``train`` call and everything it built."""

    def __init__(self) -> None:
        self._before: set[int] | None = None
        """Sockets open at :meth:`__enter__`; None before it, when the generation opened none."""

    def __enter__(self) -> "GroupSockets":
        self._before = set(socket_inodes())
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the generation's sockets are told apart at release: any opened since __enter__

    def shutdown(self) -> int:
        """Shut down the connected ones; return how many. Safe to call from any thread, twice,
        and before :meth:`__enter__` (a newer plan seen while this one had not begun to form:
        found by the 500-fault soak, where it shut the rank's own store connection)."""
        before = self._before
        if before is None:
            return 0
        count = 0
        for inode, fd in socket_inodes().items():
            if inode in before:
                continue
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                sock.getpeername()  # raises for a listening socket: leave those alone
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
            except OSError:
                pass
            finally:
                sock.close()
        return count


def release(backend: str, sockets: GroupSockets | None, groups: list[dist.ProcessGroup]) -> None:
    """Make every collective of this generation fail now, on this rank."""
    if backend == "nccl":
        for group in groups + [g for g in _created_groups() if g not in groups]:
            try:
                group.abort()
            except Exception:  # noqa: BLE001 - already aborted or destroyed
                pass
    if sockets is not None:
        sockets.shutdown()


def _created_groups() -> list[dist.ProcessGroup]:
    """Every process group of this process, ``train``'s own included (torch keeps no public list)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    return list(getattr(world, "pg_map", {}) or {})
