"""The default process group is sres's while ``train`` runs: a framework that destroys it
(``accelerator.end_training()``, a cleanup at the end of a Trainer) ends its use, not the group.

sres formed the group and still needs it after ``train`` returns: the last commit's buddy copies
run in the background, and every rank meets once more before any leaves, so that nobody's state is
needed any more. Destroyed under it, that barrier raised ("Default process group has not been
initialized") and a finished run was retried as a fault, ten times. So while ``train`` runs, a call
that would destroy the default group (and with it every group) is noted and deferred: sres destroys
it at its own teardown, as it does after every generation. A call for any other group passes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

log = logging.getLogger("resilience")

_inside = False
_original: Callable[..., Any] | None = None


def install() -> None:
    """Wrap ``destroy_process_group`` where frameworks call it (``torch.distributed`` and its
    ``distributed_c10d``); once per process."""
    global _original
    if _original is not None:
        return
    _original = c10d.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if _inside and (group is None or group is c10d.GroupMember.WORLD):
            log.debug("the default process group's destroy is deferred to sres's teardown")
            return
        assert _original is not None, "installed"
        _original(group)

    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group


@contextlib.contextmanager
def training() -> Iterator[None]:
    """While ``train`` runs: the default group's destroy is deferred."""
    global _inside
    _inside = True
    try:
        yield
    finally:
        _inside = False
