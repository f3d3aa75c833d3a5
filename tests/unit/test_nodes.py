import pytest

from launcher.errors import NotInAllocation, SlurmError
from launcher.slurm.discovery import classify, discover
from launcher.slurm.types import Node


def node(name, state="ALLOCATED", flags=(), reason="", address=""):
    return Node(
        name=name, state=state, flags=frozenset(flags), reason=reason, address=address or f"10.0.0.{name[-1]}"
    )


def test_classify_splits_healthy_and_unhealthy():
    records = [
        node("n1"),
        node("n2", "IDLE", {"DRAIN"}, "sres: xid 79"),
        node("n3", "DOWN", {"NOT_RESPONDING"}),
        node("n4", "MIXED"),
    ]
    alloc = classify("7", ["n1", "n2", "n3", "n4", "n5"], records)
    assert alloc.healthy == ("n1", "n4")
    assert alloc.unhealthy == {
        "n2": "drained: sres: xid 79",
        "n3": "DOWN+NOT_RESPONDING",
        "n5": "unknown to Slurm",
    }
    assert alloc.master_node == "n1" and alloc.master_addr == "10.0.0.1"
    assert alloc.spares(in_use=["n1"]) == ("n4",)


def test_master_moves_when_first_node_is_lost():
    alloc = classify("7", ["n1", "n2"], [node("n1", "DOWN", {"NOT_RESPONDING"}), node("n2")])
    assert alloc.master_node == "n2"


def test_no_healthy_node_is_an_error():
    alloc = classify("7", ["n1"], [node("n1", "DOWN")])
    with pytest.raises(SlurmError, match="no healthy node"):
        alloc.master_node


def test_discover_outside_allocation_says_so():
    with pytest.raises(NotInAllocation, match="SLURM_JOB_ID is unset"):
        discover(client=None, env={})  # type: ignore[arg-type]
