"""A replaced rank's replicated state from several holders at once (issue 52.3), real gloo ranks:
whole and verified when the holders agree, refused when one of them differs."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.rank_pair import run_rank_pair

# Ranks 1 and 2 hold the same state (rank 2 as a snapshot, rank 1 live); rank 0 receives it in
# two stripes, then a third from rank 1 and rank 2's diverged copy.
SCRIPT = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from resilience.errors import Unrecoverable
    from resilience.state import snapshot, transfer
    rank, port, world = (int(a) for a in sys.argv[1:4])
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    transfer.CHUNK_BYTES = 1 << 16  # many pieces: each holder sends every other one
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Linear(300, 7))
    states = {"model": model.state_dict(), "extra": {"step": 9, "name": "x"}}
    for round in ("agree", "differ", "apart", "apart differ"):
        if rank == 0:
            try:
                if round.startswith("apart"):  # each tensor in an allocation of its own
                    apart = transfer.recv_apart([1, 2])
                    alone = all(t.untyped_storage().nbytes() == t.numel() * t.element_size()
                                for t in apart.tensors)
                    print(round, alone, flush=True)
                    got = snapshot.capture(apart.states(), apart.step)
                else:
                    got = transfer.recv_striped([1, 2])
                print(round, got.step, got.digest() == snapshot.capture(states, 9).digest(), flush=True)
            except Unrecoverable as err:
                print(round, "refused", "fails its checksum" in str(err), flush=True)
        elif rank == 1:
            skeleton, tensors, sizes = snapshot.describe(states)
            transfer.send_state(9, skeleton, tensors, sizes, dst=0, stripe=(0, 2))
        else:
            mine = snapshot.capture(states, 9)
            if round.endswith("differ"):
                snapshot.materialize(mine, copy=False)["model"]["1.weight"][3, 3] += 1  # piece 7: stripe 1
            transfer.send_snapshot(mine, dst=0, stripe=(1, 2))
        dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.local  # spawns: three gloo ranks
def test_stripes_from_two_holders_make_the_whole_state_and_a_diverged_holder_is_refused():
    """Into a snapshot's flat buffers, and apart (one allocation per tensor: loaded once)."""
    ranks = run_rank_pair(SCRIPT, ranks=3)
    assert [r.returncode for r in ranks] == [0, 0, 0], [r.stderr[-2000:] for r in ranks]
    assert ranks[0].stdout.splitlines() == [
        "agree 9 True",
        "differ refused True",
        "apart True",
        "apart 9 True",
        "apart differ refused True",
    ]
