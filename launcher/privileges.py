"""Doing a user's file work as that user, never as root.

Root reads and writes, on a user's behalf, in places that user controls: the epilog cleans
the job's RAM tier, ``sres status --job J`` run by an admin reads the run's control token. As
root, a link the user planted there would get the user anything root may read or delete. So
that work runs in a child process that gave up root for the user's uid and groups first: it
can then do only what the user could, whatever they planted.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from launcher import errors
from launcher.errors import PrivilegeError


def call_as(uid: int, work: Callable[[], Any], timeout_s: float | None = None) -> Any:
    """``work()``, run as user ``uid`` (its primary group, no supplementary groups) when this
    process is root and ``uid`` is not, else here. Its result must be JSON. An ``SresError``
    it raises is raised here as the same class with the same text (so a caller's ``except
    Unreachable`` still works); any other exception as :class:`PrivilegeError`.

    ``timeout_s``: the work runs in a child process even for root's own files, and one that has
    not answered by then is killed (PrivilegeError): a user's tree can hold what makes a read
    wait forever (a FIFO on a path we must follow, a hung filesystem), and root's hooks must end."""
    drop = os.geteuid() == 0 and uid != 0
    if not drop and timeout_s is None:
        return work()
    try:
        gid = pwd.getpwuid(uid).pw_gid if drop else os.getegid()
    except KeyError:
        raise PrivilegeError(f"uid {uid} has no account here: nothing is done on its behalf") from None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: give up root for good, then work
        os.close(read)
        try:
            if drop:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            reply = {"result": work()}
        except errors.SresError as err:
            reply = {"error": str(err), "kind": type(err).__name__}
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
            reply = {"error": f"{type(err).__name__}: {err}", "kind": ""}
        with os.fdopen(write, "w") as out:
            json.dump(reply, out)
        os._exit(0)
    os.close(write)
    text = _answer(read, pid, timeout_s)
    os.waitpid(pid, 0)
    if text is None:
        raise PrivilegeError(f"as uid {uid}: no answer within {timeout_s:g} s: stopped")
    reply = json.loads(text) if text else {"error": "the child process died", "kind": ""}
    if "error" in reply:
        kind = getattr(errors, reply["kind"], None) if reply["kind"] else None
        if isinstance(kind, type) and issubclass(kind, errors.SresError):
            raise kind(reply["error"])
        raise PrivilegeError(f"as uid {uid}: {reply['error']}")
    return reply["result"]


def _answer(read: int, pid: int, timeout_s: float | None) -> str | None:
    """The child's whole reply; None (the child killed) when it is not in by ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    chunks = []
    with os.fdopen(read, "rb") as inp:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([inp], [], [], left)[0]):
                os.kill(pid, signal.SIGKILL)
                return None
            chunk = inp.read1(1 << 16)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)
