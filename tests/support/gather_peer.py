"""The two ends of one gather over a real gloo group, each run as its own user by
``tests/security/test_gather_pickles.py``:

    python -m tests.support.gather_peer victim json|object MARKER   # rank 0: prints the port first
    python -m tests.support.gather_peer attacker PORT MARKER       # rank 1

The victim gathers its holdings as a recovery does: through sres's JSON gather (``json``) or
torch's ``all_gather_object`` (``object``, the control that shows the attack is real). The
attacker joins as the other rank and sends a pickle that, unpickled, creates ``MARKER`` with the
victim's rights: the same two collectives as ``all_gather_object`` (its sizes, then its bytes).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist


class Payload:
    """What the attacker sends: unpickling it opens (creates) the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def victim(mode: str) -> None:
    from resilience.agent.recovery import gather_holdings
    from resilience.errors import Unrecoverable
    from resilience.state.recovery_plan import Holdings

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=30))
    mine = Holdings(0, own=(5,))
    if mode == "object":
        gathered: list = [None, None]
        dist.all_gather_object(gathered, mine)
        print(f"gathered {type(gathered[1]).__name__}", flush=True)
    else:
        try:
            gather_holdings(mine, dist.group.WORLD)
        except Unrecoverable as err:
            print(f"refused: {err}", flush=True)
    dist.destroy_process_group()


def attacker(port: int, marker: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timedelta(seconds=30))
    try:
        dist.all_gather_object([None, None], Payload(marker))
    except Exception as err:  # noqa: BLE001 - the victim's JSON is no pickle: nothing to do with it
        print(f"the victim's answer did not unpickle: {type(err).__name__}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(sys.argv[2])
    else:
        attacker(int(sys.argv[2]), sys.argv[3])
