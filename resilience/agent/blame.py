"""Whose fault an exception in ``train`` is: this rank's own, or a peer's.

A rank blocked in a collective fails when a peer dies or when the supervisor ends the
generation; that failure is *collateral*, and the supervisor waits briefly for the death
behind it rather than blaming this rank. Decided from structure, never from the message:
whether the generation had already been released, the exception's type, and whether it
was raised inside a torch.distributed call. (With gloo a dead peer raises a plain
RuntimeError from ``distributed_c10d``, so the type alone is not enough; torch 2.13.)
"""

from __future__ import annotations

import torch.distributed as dist

OWN, PEER, RELEASED = "own", "peer", "released"

COLLECTIVE_MODULES = (
    "torch.distributed",
    "torch.nn.parallel",
    "resilience.ddp",
    "resilience.exact",
    "torch.autograd",
    "resilience.state.transfer",
)
"""Modules whose frames mean the exception came out of communication with peers. Autograd is
one: plain DDP all-reduces from C++ hooks inside ``backward()``, so a lost peer surfaces there.
A user's own error inside ``backward()`` is then taken as collateral too, which costs at most
the supervisor's short wait for a culprit (1 s) before it is blamed anyway. Our state streams
are another: a send's ``Work.wait()`` is C++ with no torch frame above it, so a buddy copy to a
rank that just died was blamed on the sender (CI: an extra fault, a generation replacing no one)."""


def origin(err: BaseException, released: bool) -> str:
    """``released``: the generation ended under us; ``peer``: a collective failed; else ``own``."""
    if released:
        return RELEASED
    if isinstance(err, getattr(dist, "DistError", ())) or raised_in_collective(err):
        return PEER
    return OWN


def raised_in_collective(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(COLLECTIVE_MODULES):
            return True
        tb = tb.tb_next
    return False


def error_type(err: BaseException) -> str:
    kind = type(err)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
