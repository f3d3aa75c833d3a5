"""The liveness connection as a control channel: heartbeats and step times up, notices down,
every line signed; what another user (or a replay) sends over it changes nothing.

Real sockets and the real server thread: a rank's :class:`RankLink` against the supervisor's
``LivenessServer``.
"""

from __future__ import annotations

import socket

import pytest

from resilience.contract import link, run_secret
from resilience.contract.channels.plans import pause_check_every
from resilience.contract.hello import announce
from resilience.contract.liveness import LivenessServer
from resilience.contract.messages import RecentSteps, StepRecord
from tests.support.waiting import until

pytestmark = pytest.mark.local  # a server thread to wait for

SECRET = run_secret.new_secret()
KEY = link.link_key(SECRET)


@pytest.fixture
def server():
    s = LivenessServer(SECRET)
    yield s
    s.close()


def rank_link(server: LivenessServer, slot: str = "n0p0") -> link.RankLink:
    return link.RankLink(announce("127.0.0.1", server.port, slot, SECRET), SECRET, slot)


def test_a_line_reads_back_only_for_its_slot_kind_direction_and_a_newer_number():
    raw = link.line(KEY, "n0p0", 3, link.BEAT).rstrip(b"\n")
    assert link.parse(KEY, "n0p0", raw, link.UP, 2) == link.Line(link.BEAT, 3, "")
    assert link.parse(KEY, "n0p0", raw, link.UP, 3) is None  # replayed
    assert link.parse(KEY, "n1p0", raw, link.UP, 0) is None  # another slot's
    assert link.parse(KEY, "n0p0", raw, link.DOWN, 0) is None  # reflected back down
    assert link.parse(link.link_key(run_secret.new_secret()), "n0p0", raw, link.UP, 0) is None
    forged = raw.replace(b"b 3", b"b 4")
    assert link.parse(KEY, "n0p0", forged, link.UP, 0) is None
    assert link.parse(KEY, "n0p0", b"garbage", link.UP, 0) is None


def test_beats_and_steps_reach_the_supervisor_and_its_notices_reach_the_rank(server):
    rank = rank_link(server)
    assert server.beats("n0p0") in (None, 0)
    for _ in range(3):
        rank.beat()
    until(lambda: server.beats("n0p0") == 3)
    records = tuple(StepRecord(s, 0.1, 0.2, 1.0, 0.0) for s in range(1, 6))
    rank.steps(1, RecentSteps(records[:2]))
    rank.steps(1, RecentSteps(records[2:]))
    until(lambda: server.beats("n0p0") == 5)  # a step record proves the process alive as a beat does
    assert server.take_steps() == {(1, "n0p0"): list(records)}  # both lines' records, in order
    assert server.take_steps() == {}  # each record is handed out once
    assert rank.quiet_for() < 5.0
    assert server.unlinked(["n0p0", "n9p9"]) == ["n9p9"]  # no connection: its steps are in the store
    rank.steps(1, RecentSteps((StepRecord(6, 0.1, float("nan"), 1.0, 0.0),)))  # not a step time
    rank.steps(1, RecentSteps((StepRecord(7, 1, 0.2, 1.0, 0.0),)))  # not a float
    rank.beat()
    until(lambda: server.beats("n0p0") == 8)
    assert server.take_steps() == {}
    assert len(server.take_dropped()) == 2 and server.beats("n0p0") == 8  # the lines dropped, not the rank

    import threading

    threading.Thread(target=rank.listen, daemon=True).start()
    assert server.announce(link.PLANNED, 2) == 1
    server.announce(link.PAUSE, 2)
    until(lambda: rank.notices.planned == 2 and rank.notices.pause_asked(2))
    server.announce(link.SHUTDOWN)
    until(lambda: rank.notices.shut_down)
    rank.notices.wait(0, 5.0)  # returns at once: generation 2 is newer


def test_a_rank_that_writes_a_report_or_an_event_rings_and_a_stranger_rings_nothing(server):
    """The supervisor reads the store's counters of reports and events when a rank rings, not
    every tick: a report written by a rank with a link rings once; a ring of another kind or
    without the run's key moves nothing."""
    import torch.distributed as dist

    from resilience.contract.messages import Report
    from resilience.contract.run_store import RunStore

    rank, store = rank_link(server), RunStore(dist.HashStore())
    store.liveness.doorbell = store.events.doorbell = rank.wrote
    store.liveness.report(1, "n0p0", Report("error", 0, message="ValueError: bad batch"))
    until(lambda: server.rung("report") == 1)
    store.events.push("checkpoint-saved", step=3)
    until(lambda: server.rung("event") == 1)
    rank._send(link.WROTE, "everything")  # signed, but not a doorbell: nothing to ring
    sock = announce("127.0.0.1", server.port, "n1p0", SECRET)
    sock.sendall(b"w 2 " + b"0" * 32 + b" report\n")  # unsigned
    until(lambda: len(server.take_dropped()) == 1)
    rank.beat()
    until(lambda: server.beats("n0p0") == 4)  # the ring of no kind still came, and was read
    assert (server.rung("report"), server.rung("event")) == (1, 1)


def test_a_line_nobody_signed_is_dropped_and_counts_for_nothing(server):
    sock = announce("127.0.0.1", server.port, "n0p0", SECRET)
    until(lambda: server.peer("n0p0") is not None)
    dropped: list[str] = []

    def drops(count: int) -> bool:
        dropped.extend(server.take_dropped())
        return len(dropped) >= count

    sock.sendall(b"b 2 " + b"0" * 32 + b" \n")  # a beat with a wrong MAC
    sock.sendall(link.line(KEY, "n1p0", 2, link.BEAT))  # another slot's line
    until(lambda: drops(2))
    assert server.beats("n0p0") == 0
    sock.sendall(link.line(KEY, "n0p0", 2, link.BEAT))
    until(lambda: server.beats("n0p0") == 1)
    sock.sendall(link.line(KEY, "n0p0", 2, link.BEAT))  # replayed: not a second beat
    until(lambda: drops(3))
    assert server.beats("n0p0") == 1
    assert all("not one of its own" in why for why in dropped), dropped


def test_a_line_longer_than_any_rank_sends_ends_the_connection_as_a_lost_rank(server):
    sock = announce("127.0.0.1", server.port, "n0p0", SECRET)
    until(lambda: server.peer("n0p0") is not None)
    try:
        sock.sendall(b"t " + b"9" * (link.MAX_LINE + 10))
    except OSError:
        pass
    until(lambda: server.lost_at("n0p0") is not None)
    sock.close()


def test_ranks_look_for_a_pause_at_the_same_steps_and_fewer_of_them_at_scale():
    assert [pause_check_every(n) for n in (1, 512, 513, 4096, 16384)] == [1, 1, 2, 8, 32]


def test_ranks_beat_less_often_past_a_thousand_but_always_four_times_within_the_hang_timeout():
    """The supervisor reads at most ~1,024 beats a second; a hung rank is still killed after the
    hang timeout (a beat at least every quarter of it)."""
    periods = [link.beat_period(0.5, n, 30.0) for n in (8, 512, 1024, 4096, 16384)]
    assert periods == [0.5, 0.5, 1.0, 4.0, 7.5]
    assert link.beat_period(2.0, 8, 30.0) == 2.0  # what the user asked for, where it is longer


def test_a_connection_to_something_else_is_not_taken_for_the_supervisor():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 400\n")
        conn.close()

    import threading

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(ConnectionError):
        announce("127.0.0.1", port, "n0p0", SECRET)
    listener.close()


def _plan(generation: int, world: int):
    from resilience.contract import messages as m

    slots = [f"n{i}p0" for i in range(world)]
    return m.Plan(
        generation, world, dict(enumerate(slots)), {s: m.SlotInfo(i, 0) for i, s in enumerate(slots)}, 1
    )


def test_a_pause_asked_between_two_looks_stops_every_rank_before_the_same_step():
    from resilience.contract.run_store import RunStore

    server = RunStore.host(SECRET)
    a, b = (RunStore.connect("127.0.0.1", server.port, SECRET) for _ in range(2))
    assert not b.plans.pause_before(1, 8, every=4)  # b looked at step 8 before the request
    server.plans.request_pause(1, "grow")
    assert not a.plans.pause_before(1, 9, every=4)  # not a step ranks look at
    assert not a.plans.pause_before(1, 8, every=4)  # a sees it at 8: b is in step 8 already
    assert b.plans.pause_before(1, 12, every=4) and a.plans.pause_before(1, 12, every=4)


def test_a_join_waits_without_polling_and_a_newer_plan_ends_the_wait_at_once():
    import threading
    import time

    from resilience.contract.run_store import RunStore

    server = RunStore.host(SECRET)
    ranks = [RunStore.connect("127.0.0.1", server.port, SECRET) for _ in range(2)]
    got: list[bool] = []
    waiting = threading.Thread(target=lambda: got.append(ranks[0].plans.join(_plan(1, 3), 60.0)))
    waiting.start()
    until(lambda: ranks[0].core.raw.waiting != ())  # blocked in the store, not polling it
    server.plans.publish(_plan(2, 2))
    t = time.monotonic()
    heartbeat = ranks[0].clone()  # what the rank's heartbeat thread does on the notice
    assert heartbeat.plans.end_join_wait(1, ranks[0].plans) == 1
    waiting.join(timeout=10)
    assert got == [False] and time.monotonic() - t < 1.0
    both = [threading.Thread(target=lambda r=r: got.append(r.plans.join(_plan(2, 2), 60.0))) for r in ranks]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(timeout=10)
    assert got == [False, True, True]


def test_a_newer_plan_key_someone_else_wrote_does_not_hide_the_real_newest_plan():
    """The attacker replays (or forges) ``plan/2`` before the run ever makes one: a waiting rank
    still takes plan 1 at once (it once waited for plan 2 forever)."""
    from datetime import timedelta

    import torch.distributed as dist

    from resilience.contract import keys
    from resilience.contract.run_store import RunStore

    server = RunStore.host(SECRET)
    server.plans.publish(_plan(1, 2))
    stranger = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
    stranger.set(keys.plan(2), b"a sealed plan of another run")
    rank = RunStore.connect("127.0.0.1", server.port, SECRET)
    assert rank.plans.wait_for("n0p0", 0) == _plan(1, 2)


def test_a_process_that_says_it_ends_itself_is_lost_with_its_code_and_one_that_does_not_as_killed(server):
    """Under Slurm the supervisor sees a rank's connection close before srun reports its exit
    code: a rank stuck in an ended generation ends itself with ``STUCK_EXIT`` (not a fault of its
    node, not a restart) and must not be taken for a kill (CI: a run gave up at --auto-resume=1)."""
    quitting, killed = rank_link(server, "n0p0"), rank_link(server, "n1p0")
    assert server.lost_as("n0p0", killed=-9) is None  # connected
    quitting.exiting(75)
    quitting.sock.close()
    killed.sock.close()
    until(lambda: server.lost_at("n0p0") is not None and server.lost_at("n1p0") is not None)
    assert server.lost_as("n0p0", killed=-9) == 75
    assert server.lost_as("n1p0", killed=-9) == -9
    assert server.lost_as("n9p9", killed=-9) is None  # never connected


def test_a_rank_holding_the_last_plan_learns_the_next_from_its_notice_and_a_large_change_from_the_store(
    server,
):
    """A node fault's change rides in the plan's notice: a rank that holds G-1 learns G without a
    store request for it (three fewer a rank on every recovery; here its store has no plan 2 at
    all). A change too large for a notice (a world grown by hundreds) comes as a number, and the
    rank reads it from the store as before."""
    import threading
    from dataclasses import replace

    import torch.distributed as dist

    from resilience.contract.messages import Plan, SlotInfo
    from resilience.contract.run_store import RunStore

    one = Plan(1, 2, {0: "a", 1: "b"}, {"a": SlotInfo(0, 0), "b": SlotInfo(1, 0)}, 1)
    moved = {"a": SlotInfo(0, 0), "c": SlotInfo(2, 0)}
    two = replace(one, generation=2, members={0: "a", 1: "c"}, slots=moved)
    grown = {r: f"n{r}p0" for r in range(2, 400)}
    three = replace(
        two,
        generation=3,
        world_size=400,
        members={**two.members, **grown},
        slots={**two.slots, **{s: SlotInfo(r + 1, 0) for r, s in grown.items()}},
    )
    supervisor = RunStore(dist.HashStore(), SECRET)
    supervisor.plans.announce = server.announce
    answers = dist.HashStore()  # what the rank's store answers: plan 1, and later plan 3
    RunStore(answers, SECRET).plans.publish(one)
    rank = RunStore(answers, SECRET)
    linked = rank_link(server, "a")
    threading.Thread(target=linked.listen, daemon=True).start()
    rank.plans.notices = linked.notices
    assert rank.plans.get(1) == one
    supervisor.plans.publish(one)
    supervisor.plans.publish(two, one)
    assert rank.plans.wait_for("a", 1) == two
    supervisor.plans.publish(three, two)
    until(lambda: linked.notices.planned == 3)
    assert linked.notices.change_to(3) is None  # too large to ride along
    RunStore(answers, SECRET).plans.publish(three, two)
    assert rank.plans.wait_for("a", 2) == three
