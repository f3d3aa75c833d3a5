"""Leaving an ended generation, and only it: a rank blocked in its rendezvous is woken by the
heartbeat thread (on real TCPStore connections: the supervisor's server and two clients, as a
rank holds them), and a release never reaches the generation after it."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from resilience.agent.abort import GroupSockets
from resilience.agent.heartbeat import GenerationWatch
from resilience.contract.run_store import RunStore


@pytest.fixture
def stores():
    secret = secrets.token_hex(32)
    server = RunStore.host(secret)
    main = RunStore.connect("127.0.0.1", server.port, secret)
    yield server, main, main.clone()


@pytest.mark.local  # a thread blocked on a real store, and the wait for it
def test_a_wait_in_an_ended_rendezvous_ends_with_a_store_error_at_once(stores):
    _server, main, heartbeat = stores
    group = main.plans.group_store(4)
    outcome: list[BaseException | bytes] = []

    def rendezvous() -> None:  # what torch does in init_process_group: wait, then read
        try:
            group.wait(["rank_1"], timedelta(seconds=30))
            outcome.append(group.get("rank_1"))
        except BaseException as err:  # noqa: BLE001 - the outcome is what the test reads
            outcome.append(err)

    waiter = threading.Thread(target=rendezvous)
    started = time.monotonic()
    waiter.start()
    while not heartbeat.plans.end_group_waits(4, main.plans):  # until the waiter is in its wait
        assert time.monotonic() - started < 10
        time.sleep(0.01)
    waiter.join(5)
    assert not waiter.is_alive() and time.monotonic() - started < 5
    (err,) = outcome
    assert isinstance(err, dist.DistStoreError) and "generation ended" in str(err), err


@pytest.mark.local  # a thread blocked on a real store, and the wait for it
def test_only_waits_under_the_ended_generations_prefix_are_woken(stores):
    _server, main, heartbeat = stores
    later = main.plans.group_store(5)
    waiter = threading.Thread(target=lambda: later.wait(["rank_1"], timedelta(seconds=3)), daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert heartbeat.plans.end_group_waits(4, main.plans) == 0
    peer = heartbeat.plans.group_store(5)  # another connection: a client serves one thread
    peer.set("rank_1", b"an address")  # the generation's own peer writes it: the wait ends as usual
    waiter.join(5)
    assert not waiter.is_alive() and later.get("rank_1") == b"an address"


def test_a_release_meant_for_an_ended_generation_spares_the_next_one():
    """The heartbeat reads the generation, then asks the store for a newer plan; the main thread
    may enter that newer generation in between. Releasing it then shut the new generation's
    sockets down during its formation (gloo: "Connection closed by peer" on a peer)."""
    watch = GenerationWatch()
    watch.enter(3, "gloo", GroupSockets(), [])
    watch.leave()
    watch.left()
    watch.enter(4, "gloo", GroupSockets(), [])  # the main thread is in generation 4 now
    assert watch.release_now(3) is False and not watch.released()
    assert watch.release_now(4) is True and watch.released()
