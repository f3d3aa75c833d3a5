"""The supervisor's pure decisions: who replaces a lost rank, which rank is hung, bad config."""

from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.supervisor import RunConfig, await_culprit, replace, silent_slots
from resilience.contract.injections import parse
from resilience.contract.messages import Report, SlotInfo

SLOTS = {f"n{n}p{p}": SlotInfo(n, p) for n in range(4) for p in range(2)}
MEMBERS = {n * 2 + p: f"n{n}p{p}" for n in range(3) for p in range(2)}  # node 3 is the spare


def spare(node, local):
    return f"n{node}p{local}"


def respawn(node, local):
    return f"n{node}p{local}r1"


def test_node_loss_moves_its_ranks_to_one_spare_node_keeping_local_ranks():
    decision = replace(
        MEMBERS,
        SLOTS,
        {2: True, 3: True},
        dead_nodes={1},
        spare_nodes=[3],
        spare_slot=spare,
        respawn_slot=respawn,
    )
    assert decision.members[2] == "n3p0" and decision.members[3] == "n3p1"
    assert decision.used_spare_nodes == (3,) and decision.spawn == ()


def test_process_fault_restarts_on_its_own_node():
    decision = replace(
        MEMBERS, SLOTS, {4: False}, dead_nodes=set(), spare_nodes=[3], spare_slot=spare, respawn_slot=respawn
    )
    assert decision.members[4] == "n2p0r1"
    assert decision.spawn == (("n2p0r1", 2, 0),) and decision.used_spare_nodes == ()


def test_node_loss_without_spare_is_a_clear_error():
    with pytest.raises(ConfigError, match="no spare node is left"):
        replace(
            MEMBERS,
            SLOTS,
            {0: True, 1: True},
            dead_nodes={0},
            spare_nodes=[],
            spare_slot=spare,
            respawn_slot=respawn,
        )


def test_silent_slots():
    changed = {"a": 10.0, "b": 19.0, "c": 0.0}
    started = {"a": 0.0, "b": 0.0, "c": 0.0}
    seen = {"a": True, "b": True, "c": False}
    assert silent_slots(changed, started, seen, now=20.0, hang_timeout_s=3, startup_timeout_s=60) == ["a"]
    assert silent_slots(changed, started, seen, now=61.0, hang_timeout_s=3, startup_timeout_s=60) == [
        "a",
        "b",
        "c",
    ]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"nodes": 0}, "--nodes must be at least 1"),
        ({"command": ()}, "no training command"),
        ({"spares": -1}, "--spares cannot be negative"),
        ({"hang_timeout_s": 0.5}, "--hang-timeout must exceed"),
        ({"injections": parse(["kill:rank=9:step=1"])}, "there are ranks 0..3"),
        ({"injections": parse(["node:4:step=1"])}, "there are nodes 0..3"),
    ],
)
def test_run_config_refuses_bad_input(kwargs, words):
    base = dict(command=("python", "train.py"), nodes=4, log_dir=Path("/tmp/x"))
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("-", r"\-")):
        RunConfig(**{**base, **kwargs})


def test_collateral_errors_alone_wait_briefly_for_the_death_that_caused_them():
    peer_lost = {"n3p0": Report("error", 3, message="Connection closed by peer", collateral=True)}
    assert await_culprit({}, peer_lost, None, now=5.0)  # first seen: wait
    assert await_culprit({}, peer_lost, 5.0, now=5.9, grace_s=1.0)
    assert not await_culprit({}, peer_lost, 5.0, now=6.1, grace_s=1.0)  # no death came: an exception
    assert not await_culprit({2: "kill"}, peer_lost, 5.0, now=5.1)  # the death came: handle it
    own = {**peer_lost, "n1p0": Report("error", 1, message="ValueError: bad batch")}
    assert not await_culprit({}, own, None, now=5.0)  # a rank's own error is handled at once
    assert not await_culprit({}, {}, None, now=5.0)
