"""Whose fault an exception is (resilience.agent.blame), from real exceptions, never from text."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.distributed as dist

from resilience.contract import injections
from resilience.agent import blame, faults
from resilience.contract.messages import Report
from tests.support.rank_pair import run_rank_pair


def caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as err:  # noqa: BLE001
        return err
    raise AssertionError("no exception")


def test_a_users_own_error_is_own_even_when_it_names_a_connection():
    err = caught(lambda: (_ for _ in ()).throw(RuntimeError("Connection closed by peer")))
    assert blame.origin(err, released=False) == blame.OWN


def test_an_injected_raise_is_own():
    injection = injections.parse(["raise:rank=0:step=1"])[0]
    err = caught(lambda: faults.perform(injection))
    assert blame.origin(err, released=False) == blame.OWN


def test_an_error_raised_inside_torch_distributed_is_a_peers():
    err = caught(lambda: dist.all_reduce(torch.ones(1)))  # no group: raised by distributed_c10d itself
    assert blame.origin(err, released=False) == blame.PEER


def test_a_dist_error_is_a_peers_by_its_type():
    assert blame.origin(dist.DistBackendError("x"), released=False) == blame.PEER


def test_any_error_after_the_generation_was_released_is_collateral():
    assert blame.origin(ValueError("anything"), released=True) == blame.RELEASED


_PAIR = """
import os, sys, time
import torch, torch.distributed as dist
from resilience.agent import blame
from resilience.state import snapshot, transfer
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
dist.all_reduce(torch.ones(4))
"""
"""Two gloo ranks that have met once; each test's lines follow."""


@pytest.mark.local  # spawns: the gloo peer ranks
def test_a_real_gloo_collective_whose_peer_died_is_a_peers():
    """Rank 1 dies; rank 0's all_reduce raises gloo's plain RuntimeError, seen as a peer's fault."""
    script = _PAIR + textwrap.dedent("""
        if rank == 1:
            os._exit(9)
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as err:
            print(type(err).__name__, blame.origin(err, released=False))
    """)
    assert run_rank_pair(script, timeout=60)[0].stdout.split() == ["RuntimeError", "peer"]


@pytest.mark.local  # spawns: the gloo peer ranks
def test_a_state_stream_to_a_peer_that_died_is_a_peers():
    """Rank 0 streams a snapshot to rank 1, which has died: the send's ``Work.wait()`` raises
    with no torch frame above it, and it is still the peer's fault."""
    script = _PAIR + textwrap.dedent("""
        if rank == 1:
            time.sleep(1.0)  # alive while rank 0 posts its sends, gone while it waits on them
            os._exit(9)
        snap = snapshot.capture({"w": torch.ones(16 << 20)}, step=1)  # 64 MiB: more than a socket holds
        try:
            transfer.send_snapshot(snap, 1)
        except Exception as err:
            print(type(err).__name__, blame.origin(err, released=False))
    """)
    assert run_rank_pair(script, timeout=60)[0].stdout.split()[-1:] == ["peer"]


def test_reports_carry_the_origin_and_type_and_old_reports_still_read():
    rep = Report(
        "error", 2, message="RuntimeError: x", collateral=True, origin="peer", error_type="RuntimeError"
    )
    assert Report.decode(rep.encode()) == rep
    old = Report.decode('{"kind": "error", "rank": 1, "message": "m", "collateral": false}')
    assert old.origin == "own" and old.error_type == ""


# Every error class under its package's base: tests/unit/test_errors.py walks the modules for them.
