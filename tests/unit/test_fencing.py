"""Fencing without a cluster: the lease a rank holds from the supervisor's echoes, and the
generation every copy and answer carries (:mod:`resilience.contract.lease`, the tiers' manifests,
restore plans, flush requests, neighbour copies).

The lease's arithmetic runs on a fake clock; its renewal runs over a real liveness connection
(the real server thread); the tiers write and read real files.
"""

from __future__ import annotations

import threading

import pytest
import torch

from resilience.contract import link, run_secret
from resilience.contract.lease import Lease, lease_s
from resilience.contract.hello import announce
from resilience.contract.liveness import LivenessServer
from resilience.errors import Fenced
from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.layout import complete_steps
from resilience.tiers.restore import Offer, plan_restore
from resilience.tiers.transport import NeighbourServer, push_checkpoint
from tests.support.waiting import until

SECRET = run_secret.new_secret()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_echo_extends_the_lease_from_when_its_line_was_sent_not_when_it_came():
    clock = Clock()
    lease = Lease(4.0, clock)
    assert lease.left_s() == 4.0  # granted at the hello's acceptance
    lease.sent(1, 101.0)
    lease.sent(2, 102.0)
    clock.t = 103.0
    lease.echoed(2)
    assert lease.left_s() == pytest.approx(3.0)  # 102 + 4 - 103
    clock.t = 110.0  # a partition (or a SIGSTOP): the echo of line 1, buffered, comes now
    lease.echoed(1)
    assert lease.expired()  # renews nothing: line 1 was sent at 101
    with pytest.raises(
        Fenced,
        match=r"for 8.0 s \(lease 4 s; last line sent 8.0 s ago, last echo read 0.0 s ago\): refused",
    ):
        lease.check("write step 9")


def test_a_starved_rank_and_a_silent_supervisor_read_apart():
    """What the fenced rank prints tells the two causes apart: it sent nothing (its threads were
    not run), or it sent and no echo came (a cut link, or the supervisor starved)."""
    clock = Clock()
    lease = Lease(2.0, clock)
    clock.t = 103.0
    assert "last line sent never, last echo read never" in lease.account()
    lease.sent(1, 102.5)
    assert "last line sent 0.5 s ago, last echo read never" in lease.account()


def test_an_echo_of_a_line_never_sent_renews_nothing():
    clock = Clock()
    lease = Lease(1.0, clock)
    lease.sent(5, 100.0)
    clock.t = 100.9
    lease.echoed(7)  # not a number this process used
    assert lease.left_s() == pytest.approx(0.1)


def test_the_lease_ends_before_the_supervisor_would_replace_the_rank():
    """The rank's last echoed line was sent no later than the supervisor's last hearing of it:
    its lease ends a quarter of a hang timeout before the supervisor calls it silent."""
    for hang in (3.0, 30.0, 600.0):
        assert lease_s(hang) <= hang * 3 / 4


@pytest.mark.local
def test_the_supervisors_echo_renews_a_ranks_lease_over_a_real_connection():
    server = LivenessServer(SECRET)
    try:
        rank = link.RankLink(announce("127.0.0.1", server.port, "n0p0", SECRET), SECRET, "n0p0", lease_s=1.0)
        threading.Thread(target=rank.listen, daemon=True).start()
        assert rank.lease is not None
        for _ in range(8):  # beating every 0.25 s for 2 s: twice the lease
            rank.beat()
            threading.Event().wait(0.25)
            assert not rank.lease.expired()
        until(lambda: rank.lease.expired(), timeout=3.0)  # silent: nothing is echoed
    finally:
        server.close()


def _snaps(step: int) -> dict[str, snapshot.Snapshot]:
    return {"replicated": snapshot.capture({"w": torch.arange(4.0) + step}, step)}


def test_a_manifest_carries_the_generation_that_wrote_it(tmp_path):
    path = mf.write(tmp_path, "J", 7, 1, 0, _snaps(7), generation=3)
    assert mf.read_manifest(path, "J").generation == 3


def test_a_step_written_by_two_generations_is_not_complete(tmp_path):
    """Rank 1's copy of step 7 came late from a rank of generation 2 cut off from generation 3:
    the persistent tier does not count the step complete (nothing reads a mix of timelines)."""
    mf.write(tmp_path, "J", 7, 2, 0, _snaps(7), generation=3)
    mf.write(tmp_path, "J", 7, 2, 1, _snaps(7), generation=2)
    mf.write(tmp_path, "J", 6, 2, 0, _snaps(6), generation=2)
    mf.write(tmp_path, "J", 6, 2, 1, _snaps(6), generation=2)
    assert complete_steps(tmp_path, "J") == {6: 2}


def test_a_restore_takes_one_steps_copies_from_one_generation():
    """Rank 1's own copy of step 8 is from generation 2 (written before the fault, or late by a
    cut-off rank); generation 3 rewrote the step on rank 0 only. Neither mix is restored: the
    newest step whose every copy one generation wrote is (step 7)."""
    offers = [
        Offer("ram", 0, 0, 8, 2, generation=3),
        Offer("ram", 1, 1, 8, 2, generation=2),
        Offer("ram", 0, 0, 7, 2, generation=2),
        Offer("ram", 1, 1, 7, 2, generation=2),
    ]
    plan = plan_restore(2, offers, -1)
    assert plan is not None and plan.step == 7
    complete = [*offers, Offer("neighbour", 0, 1, 8, 2, generation=3)]
    plan = plan_restore(2, complete, -1)
    assert plan is not None and plan.step == 8 and plan.tier_of(1) == "neighbour"  # generation 3's


def test_a_neighbour_copy_from_an_older_generation_is_refused_before_a_byte_is_written(tmp_path):
    generation = [4]
    server = NeighbourServer(tmp_path / "in", "J", 2, SECRET, generation=lambda: generation[0]).start()
    try:
        src = mf.write(tmp_path / "out", "J", 5, 2, 1, _snaps(5), generation=3)
        with pytest.raises(ConnectionError):
            push_checkpoint(server.link, src, "J", 1, 5, generation=3)
        assert "a copy from generation 3 after 4 began" in server.refused[-1]
        assert not (tmp_path / "in").exists() or not any((tmp_path / "in").rglob("*.bin"))
        generation[0] = 3
        push_checkpoint(server.link, src, "J", 1, 5, generation=3)
        assert mf.read_manifest(mf.rank_dir(tmp_path / "in", 5, 1), "J").generation == 3
    finally:
        server.stop()


def test_progress_from_an_older_generation_is_refused_once_a_newer_one_wrote():
    """A rank 0 cut off in generation 2, whose write sat in its socket through the partition,
    reads generation 3's progress first on the same connection and writes nothing."""
    import torch.distributed as dist

    from resilience.contract.run_store import RunStore

    store = RunStore(dist.HashStore())
    assert store.progress.set_step(12, generation=2)
    assert store.progress.set_step(14, generation=3)
    assert not store.progress.set_step(13, generation=2)  # the stale rank's late write
    assert store.progress.step() == 14
    assert store.progress.set_step(15, generation=3) and store.progress.step() == 15


def test_a_rank_past_its_lease_writes_nothing_to_the_store():
    import torch.distributed as dist

    from resilience.contract.run_store import RunStore

    clock = Clock()
    lease = Lease(2.0, clock)
    store = RunStore(dist.HashStore())
    store.core.guard = lease.check
    store.progress.set_step(3, generation=1)
    clock.t += 2.5
    with pytest.raises(Fenced, match="refused to write progress"):
        store.progress.set_step(4, generation=1)
    with pytest.raises(Fenced):
        store.clone().events.push("checkpoint-saved", tier="ram", step=4, seconds=0.1)  # clones too
    assert store.progress.step() == 3
