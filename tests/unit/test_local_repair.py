"""Simulated nodes that come back from repair (``sres run --repair-after S``), as resumed
nodes do on a cluster: only after the delay, once each, under a new node number."""

from __future__ import annotations

import pytest

from launcher.placement.local import LocalPlacement


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.local  # spawns: `true` on each node
def test_a_drained_node_returns_after_its_repair_under_a_new_number(tmp_path):
    clock = Clock()
    placement = LocalPlacement(tmp_path, repair_after_s=5.0, clock=clock)
    for node in range(3):
        placement.spawn(f"n{node}p0", node, ["true"], {})
    placement.retire(1, "repeated failure")
    clock.now = 4.9
    assert placement.idle_node() is None
    clock.now = 5.0
    back = placement.idle_node()
    assert (back.node, back.host, back.how, back.returned) == (3, "node3", "idle", True)
    assert placement.idle_node() is None  # once
    placement.stop_all()


def test_without_repairs_lost_nodes_stay_lost(tmp_path):
    placement = LocalPlacement(tmp_path)
    placement.retire(0, "node lost")
    assert placement.idle_node() is None
