"""Every slot name the run makes is a safe file name and names its node back."""

from __future__ import annotations

from resilience.contract import slots


def test_each_kind_of_slot_is_a_distinct_safe_name() -> None:
    made = [
        slots.rank_slot(3, 1),
        slots.respawn_slot(3, 1, 7),
        slots.standby_slot(3, 0),
        slots.producer_slot(3),
        slots.fork_server_slot(3),
    ]
    assert made == ["n3p1", "n3p1r7", "n3s0", "n3b", "n3f"]
    assert len(set(made)) == len(made)
    assert all(slots.NAME.fullmatch(s) for s in made)


def test_a_name_from_elsewhere_is_checked_before_it_names_a_file() -> None:
    for bad in ("../x", "n0p0/..", "a.b", "", "x" * 65):
        assert not slots.NAME.fullmatch(bad)
