"""The supervisor <-> rank contract: every message survives its encoding, and a reader of an
older or newer writer still reads it (fields added on one side never break the other)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch.distributed as dist

from resilience.contract import keys, run_secret
from resilience.contract import messages as m
from resilience.contract.run_store import RunStore
from resilience.errors import ForgedValue

SAMPLES: dict[type[m.Message], m.Message] = {
    m.Plan: m.Plan(
        generation=3,
        world_size=2,
        members={0: "n0p0", 1: "n2p0"},
        slots={"n0p0": m.SlotInfo(0, 0), "n2p0": m.SlotInfo(2, 0)},
        procs_per_node=1,
        replaced=(1,),
        reason="node 1 lost",
        config={"global_batch": 64},
    ),
    m.PlanChange: m.PlanChange(
        generation=4,
        world_size=2,
        members={1: "n3p0"},
        slots={"n3p0": m.SlotInfo(3, 0)},
        dropped=(),
        left=("n2p0",),
        procs_per_node=1,
        replaced=(1,),
        reason="node 2 lost",
    ),
    m.Report: m.Report(
        "error",
        1,
        seq=4,
        message="ValueError: bad",
        traceback="Traceback...",
        collateral=True,
        t=12.5,
        origin="peer",
        error_type="ValueError",
        digest="",
        step=17,
    ),
    m.RecoveryInfo: m.RecoveryInfo(
        step=19, source="peer", bytes=1 << 20, recover_s=0.12, formed_t=100.5, recovered_t=100.6
    ),
    m.BatchInfo: m.BatchInfo(global_batch=64, accumulation=2, lr_scale=0.5, kept=True),
    m.RunStats: m.RunStats(median_step_s=0.031),
    m.Progress: m.Progress(step=41, generation=3),
    m.RecentSteps: m.RecentSteps(
        (m.StepRecord(5, 0.01, 0.02, 1e9, 0.0), m.StepRecord(6, 0.011, 0.021, 1e9 + 1, 0.001))
    ),
    m.FlushRequest: m.FlushRequest(id=2, step=None, timeout_s=30.0),
    m.FlushDone: m.FlushDone(step=40, error="disk full"),
    m.RankEvent: m.RankEvent("checkpoint-saved", {"rank": 1, "step": 40, "tier": "ram"}, 1e9),
}


def test_every_message_type_has_a_sample():
    assert set(SAMPLES) == set(m.MESSAGES)


@pytest.mark.parametrize("kind", m.MESSAGES, ids=lambda k: k.__name__)
def test_every_message_round_trips(kind):
    sample = SAMPLES[kind]
    text = sample.encode()
    json.loads(text)  # plain JSON on the wire: readable in a store dump
    assert kind.decode(text) == sample
    assert kind.decode(text.encode()) == sample  # a store returns bytes


@pytest.mark.parametrize(
    "kind", [k for k in m.MESSAGES if k not in (m.RecentSteps, m.RankEvent)], ids=lambda k: k.__name__
)
def test_a_field_a_newer_writer_added_is_left_out(kind):
    data = json.loads(SAMPLES[kind].encode())
    assert kind.decode(json.dumps({**data, "added_in_a_later_version": 1})) == SAMPLES[kind]


def test_a_report_from_an_older_writer_gets_the_defaults():
    assert m.Report.decode('{"kind": "done", "rank": 0}') == m.Report("done", 0)


def test_the_store_accessors_carry_each_message_whole():
    store = RunStore(dist.HashStore())
    plan = SAMPLES[m.Plan]
    store.plans.publish(plan)
    assert store.plans.get(3) == plan and store.plans.get(4) is None and store.plans.has(3)
    written = store.liveness.report(3, "n0p0", SAMPLES[m.Report])
    assert (
        written.seq == 1
        and store.liveness.report_of(3, "n0p0") == written
        and store.liveness.reports_written(3) == 1
        and store.liveness.reports(3) == [written]
    )
    store.progress.publish_recovery(3, SAMPLES[m.RecoveryInfo])
    store.progress.publish_batch(3, SAMPLES[m.BatchInfo])
    store.progress.publish_stats(3, SAMPLES[m.RunStats])
    store.progress.publish_steps(3, "n0p0", SAMPLES[m.RecentSteps])
    assert (
        store.progress.recovery(3),
        store.progress.batch(3),
        store.progress.stats(3),
        store.progress.recent_steps(3, "n0p0"),
    ) == (
        SAMPLES[m.RecoveryInfo],
        SAMPLES[m.BatchInfo],
        SAMPLES[m.RunStats],
        SAMPLES[m.RecentSteps],
    )
    assert store.progress.step() is None
    store.progress.set_step(41)
    assert store.progress.step() == 41
    request = store.tiers.request_flush(None, 30.0)
    assert store.tiers.flush_request() == m.FlushRequest(request, None, 30.0)
    assert store.tiers.flush_answers(request, [0, 1]) is None
    for rank in (0, 1):
        store.tiers.answer_flush(request, rank, m.FlushDone(40))
    assert store.tiers.flush_answers(request, [0, 1]) == [m.FlushDone(40), m.FlushDone(40)]


def _plans(draw_world, data):
    """Two successive plans as a supervisor makes them: ranks 0..W-1, each a slot on some node."""
    world = data.draw(draw_world)
    slots = data.draw(st.lists(st.sampled_from(range(64)), min_size=world, max_size=world, unique=True))
    return m.Plan(
        data.draw(st.integers(1, 100)),
        world,
        {r: f"n{s // 4}p{s % 4}" for r, s in enumerate(slots)},
        {f"n{s // 4}p{s % 4}": m.SlotInfo(s // 4, s % 4) for s in slots},
        4,
        reason=data.draw(st.text(max_size=5)),
    )


@given(st.data())
def test_a_plan_read_as_its_change_from_the_one_before_is_that_plan(data):
    """Shrunk, grown, ranks moved to spares: ``apply(between(a, b), a) == b`` whatever changed."""
    base = _plans(st.integers(1, 24), data)
    plan = replace(_plans(st.integers(1, 24), data), generation=base.generation + 1)
    change = m.PlanChange.decode(m.PlanChange.between(base, plan).encode())
    assert change.apply(base) == plan


def test_a_rank_holding_the_last_plan_reads_only_the_next_ones_change():
    """The change is what a rank reads on recovery (O(changes), not the N members); a rank that
    missed a generation, or whose change does not open, reads the whole plan."""
    under = dist.HashStore()
    server = RunStore(under, run_secret.new_secret())
    one = m.Plan(1, 3, {0: "a", 1: "b", 2: "c"}, {s: m.SlotInfo(i, 0) for i, s in enumerate("abc")}, 1)
    two = replace(
        one, generation=2, members={0: "a", 1: "d", 2: "c"}, slots={**one.slots, "d": m.SlotInfo(3, 0)}
    )
    del two.slots["b"]
    three = replace(two, generation=3, world_size=2, members={0: "a", 1: "d"})
    del three.slots["c"]
    server.plans.publish(one)
    server.plans.publish(two, one)
    server.plans.publish(three, two)
    rank = RunStore(server.core)
    assert rank.plans.get(1) == one
    under.set(keys.plan(2), "a whole plan nobody reads here")
    assert rank.plans.get(2) == two and rank.plans.get(3) == three
    late, other = RunStore(server.core), RunStore(server.core)
    under.set(keys.plan_change(3), "a change another user wrote")
    assert other.plans.get(1) == one and other.plans.get(2) == two and other.plans.get(3) == three
    assert late.plans.get(1) == one and late.plans.newest_plan(1) == (3, three)


@pytest.mark.local  # sleeps 0.3 s so the ranks wait
def test_a_waiting_rank_finds_its_plan_at_once_and_joins_and_a_shutdown_ends_the_wait():
    """On the recovery path: a plan published while ranks wait is seen within a short poll,
    the join barrier lets both through, and a shutdown ends a spare's wait."""
    import threading
    import time

    secret = run_secret.new_secret()
    server = RunStore.host(secret)
    ranks = [RunStore.connect("127.0.0.1", server.port, secret) for _ in range(2)]
    plan = m.Plan(1, 2, {0: "a", 1: "b"}, {"a": m.SlotInfo(0, 0), "b": m.SlotInfo(1, 0)}, 1)
    got: dict[str, tuple[m.Plan | None, float, bool]] = {}

    def rank(store: RunStore, slot: str) -> None:
        seen = store.plans.wait_for(slot, 0)
        at = time.monotonic()
        got[slot] = (seen, at, store.plans.join(seen, 30.0))

    threads = [threading.Thread(target=rank, args=(s, slot)) for s, slot in zip(ranks, "ab")]
    for t in threads:
        t.start()
    time.sleep(0.3)
    published = time.monotonic()
    server.plans.publish(plan)
    for t in threads:
        t.join(timeout=10)
    assert all(got[s][0] == plan and got[s][2] for s in "ab")
    assert max(got[s][1] for s in "ab") - published < 0.5
    spare = RunStore.connect("127.0.0.1", server.port, secret)
    ended = threading.Thread(
        target=lambda: got.setdefault("spare", (spare.plans.wait_for("c", 1, poll_s=0.05), 0, 0))
    )
    ended.start()
    server.plans.shut_down()
    ended.join(timeout=10)
    assert got["spare"][0] is None


@pytest.mark.local  # threads blocked in the store's wait
def test_ranks_that_hear_notices_join_on_the_last_arrival_and_leave_a_barrier_a_newer_plan_ended():
    """With notices, a wake of the join barrier is the last arrival's unless a newer plan was
    announced (no count is asked after it): both ranks join. A rank whose barrier a newer plan
    ended leaves it with False when its heartbeat wakes it, and one that heard the newer plan
    before it waited does not wait."""
    import threading

    from resilience.contract import link
    from tests.support.waiting import until

    secret = run_secret.new_secret()
    server = RunStore.host(secret)
    plan = m.Plan(2, 2, {0: "a", 1: "b"}, {"a": m.SlotInfo(0, 0), "b": m.SlotInfo(1, 0)}, 1)
    ranks = [RunStore.connect("127.0.0.1", server.port, secret) for _ in range(3)]
    for rank in ranks:
        rank.plans.notices = link.Notices()
    joined: dict[str, bool] = {}
    first = threading.Thread(target=lambda: joined.setdefault("a", ranks[0].plans.join(plan, 30.0)))
    first.start()
    until(lambda: ranks[0].raw.waiting)  # in the barrier's wait
    assert ranks[1].plans.join(plan, 30.0)  # the last arrival
    first.join(timeout=10)
    assert joined == {"a": True}

    ended = replace(plan, generation=3, world_size=3)
    left = threading.Thread(target=lambda: joined.setdefault("c", ranks[2].plans.join(ended, 30.0)))
    left.start()
    until(lambda: ranks[2].raw.waiting)
    ranks[2].plans.notices.heard(link.Line(link.PLANNED, 1, "4"))  # plan 4 announced
    heartbeat = RunStore.connect("127.0.0.1", server.port, secret)
    assert heartbeat.plans.end_join_wait(3, ranks[2].plans) == 1
    left.join(timeout=10)
    assert joined["c"] is False
    ranks[1].plans.notices.heard(link.Line(link.PLANNED, 1, "4"))
    assert ranks[1].plans.join(ended, 30.0) is False and not ranks[1].raw.waiting


def test_a_value_written_without_the_runs_secret_reads_as_absent_and_is_noted():
    """Another user who reaches the store's port sets keys directly: a plan, the preemption
    flag, a node-kill request, a gloo rendezvous address. None of it is taken; each is noted."""
    under = dist.HashStore()
    store = RunStore(under, run_secret.new_secret())
    plan = m.Plan(1, 2, {0: "a", 1: "b"}, {"a": m.SlotInfo(0, 0), "b": m.SlotInfo(1, 0)}, 1)
    under.set(keys.plan(1), plan.encode())
    under.set(keys.PREEMPT, "attacker")
    under.set(keys.node_kill(0), "node:0")
    under.add(keys.NODE_KILLS, 1)
    under.set(keys.PROGRESS, "99999")
    assert store.plans.get(1) is None and not store.plans.has(1)
    assert store.signals.preempted_by() is None and not store.faults.take_node_kill(0)
    assert store.progress.step() is None
    assert set(store.forged) == {keys.plan(1), keys.PREEMPT, keys.node_kill(0), keys.PROGRESS}
    under.set(f"{keys.pg_prefix(1)}/0", b"10.0.0.9:1234")  # where torch's rendezvous looks for rank 0
    with pytest.raises(ForgedValue):
        store.plans.group_store(1).get("0")
    store.plans.publish(plan)  # the run's own value, over the forged one
    assert store.plans.get(1) == plan


def test_a_value_signed_in_an_earlier_run_of_the_same_log_dir_is_refused():
    """A requeued job keeps its secret (the log dir holds it); each supervisor start signs under
    a fresh nonce, so a plan copied from the first run's store into the next one's (replay by
    anyone who read it there) reads as absent: the second run never forms the first's world."""
    secret = run_secret.new_secret()
    first_under, second_under = dist.HashStore(), dist.HashStore()
    first = RunStore(first_under, run_secret.store_key(secret, run_secret.new_challenge()))
    second = RunStore(second_under, run_secret.store_key(secret, run_secret.new_challenge()))
    plan = m.Plan(2, 2, {0: "a", 1: "b"}, {"a": m.SlotInfo(0, 0), "b": m.SlotInfo(1, 0)}, 1)
    first.plans.publish(plan)
    second_under.set(keys.plan(2), first_under.get(keys.plan(2)))  # the signed bytes, copied
    assert first.plans.get(2) == plan
    assert second.plans.get(2) is None and set(second.forged) == {keys.plan(2)}


def test_a_heartbeat_another_user_writes_or_replays_never_reads_as_newer():
    """A heartbeat was a counter, and bumping it hid a real hang for 150 s. It is a signed time
    now, and the supervisor counts a beat only when it is newer than the last it saw: a forged
    value reads as none, a replayed older one is not newer."""
    under = dist.HashStore()
    store = RunStore(under, run_secret.new_secret())
    key = keys.heartbeat("n0p0")
    store.liveness.beat("n0p0")
    first, first_bytes = store.liveness.heartbeats("n0p0"), under.get(key)
    store.liveness.beat("n0p0")
    second = store.liveness.heartbeats("n0p0")
    assert 0 < first < second
    under.set(key, first_bytes)  # replayed
    assert store.liveness.heartbeats("n0p0") == first < second
    under.set(key, str(second + 10**12))  # a bigger number without the run's MAC
    assert store.liveness.heartbeats("n0p0") == 0


def test_the_store_listens_only_where_its_ranks_reach_it():
    """torch's server listens on every interface by itself; a run on one machine keeps its
    store (plans, hosts, ports: signed, not secret) off the network."""
    import os

    from tests.support.attacker import listening

    secret = run_secret.new_secret()
    server = RunStore.host(secret)
    rank = RunStore.connect("127.0.0.1", server.port, secret)
    rank.liveness.beat("a")
    assert server.liveness.heartbeats("a") > 0
    assert [a for a in listening(os.geteuid()) if a[1] == server.port] == [("127.0.0.1", server.port)]


def test_every_report_of_a_generation_is_read_in_two_requests_and_a_forged_one_spoils_none_silently():
    under = dist.HashStore()
    store = RunStore(under, run_secret.new_secret())
    first = store.liveness.report(2, "n0p0", m.Report("error", 0))
    second = store.liveness.report(2, "n1p0", m.Report("error", 1))
    assert store.liveness.reports(2) == [first, second] and store.liveness.reports(5) == []
    under.set(keys.report_at(2, 3), m.Report("done", 7).encode())  # another user's, numbered next
    under.add(keys.report_ready(2), 1)
    assert store.liveness.reports(2) is None and keys.report_at(2, 3) in store.forged
