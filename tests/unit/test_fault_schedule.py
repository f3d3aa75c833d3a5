"""The seeded random fault schedule: reproducible, at the asked rate, only the asked kinds."""

from __future__ import annotations

import pytest

from resilience.agent import fault_schedule as fs
from resilience.agent.faults import due
from resilience.contract.injections import InjectSpecError, parse


def test_a_recorded_seed_replays_the_same_faults():
    spec = fs.parse("random:seed=7:every=15:kinds=kill,node,raise:to=3000")
    first = fs.expand(spec, world_size=8)
    assert first == fs.expand(fs.parse(spec.spec), world_size=8)  # the recorded spec replays
    assert [i.spec for i in first] != [
        i.spec for i in fs.expand(fs.parse("random:seed=8:every=15:to=3000"), world_size=8)
    ]
    assert 3000 / 15 * 0.8 < len(first) < 3000 / 15 * 1.2
    assert {i.kind for i in first} == {"kill", "node", "raise"}
    assert all(1 <= i.step <= 3000 and 0 <= i.rank < 8 for i in first)
    assert len({i.step for i in first}) == len(first)  # at most one fault per step


def test_the_schedule_goes_through_specs_as_the_ranks_receive_them():
    """The ranks re-parse the specs: the same faults, with the same indices (fired once each)."""
    injections, lines = fs.injections_from(
        ["kill:rank=0:step=3", "random:seed=1:every=5:to=200"], world_size=4
    )
    assert injections[0].spec == "kill:rank=0:step=3"
    assert parse([i.spec for i in injections]) == injections
    assert len(lines) == 1 and lines[0].startswith("random faults (seed 1, one per 5 steps): ")
    node = next(i for i in injections if i.kind == "node")
    assert node.spec.startswith(f"node:rank={node.rank}:step=")
    assert due([node], rank=node.rank, node=9, kinds=["node"], step=node.step) == [
        node
    ]  # whatever node runs it
    assert due([node], rank=(node.rank + 1) % 4, node=9, kinds=["node"], step=node.step) == []


@pytest.mark.parametrize(
    "bad, words",
    [
        ("random:seed=1", "use random:seed=S:every=N"),
        ("random:seed=1:every=0.5", "every=0.5 must be at least 1"),
        ("random:seed=1:every=5:kinds=kill,explode", "kinds=kill,explode: use some of"),
        ("random:seed=1:every=5:from=9:to=3", "from=9 to=3"),
    ],
)
def test_bad_random_specs_name_the_problem(bad, words):
    with pytest.raises(InjectSpecError, match=words):
        fs.injections_from([bad], world_size=4)


def test_paired_kinds_come_with_the_fault_that_makes_them_matter():
    spec = fs.parse("random:seed=5:every=3:kinds=corrupt-ram,kill-during-transfer:count=20")
    schedule = fs.expand(spec, world_size=4)
    assert len({i.step for i in schedule}) == 20 and len(schedule) == 40
    for step in {i.step for i in schedule}:
        kinds = sorted(i.kind for i in schedule if i.step == step)
        assert kinds in (["corrupt-ram", "kill-all"], ["kill", "kill-during-transfer"])
    first = next(i for i in schedule if i.kind == "corrupt-ram")
    later = next(i for i in schedule if i.kind == "kill-all" and i.step == first.step)
    assert first.index < later.index  # the copy is corrupted before every rank dies
    assert parse([i.spec for i in schedule]) == schedule


def test_a_full_disk_frees_up_nine_steps_later_on_the_same_rank():
    schedule = fs.expand(fs.parse("random:seed=2:every=4:kinds=fill-disk:count=5"), world_size=4)
    fills = [i for i in schedule if i.kind == "fill-disk"]
    frees = [i for i in schedule if i.kind == "free-disk"]
    assert len(fills) == len(frees) == 5
    assert [(i.rank, i.step + 9) for i in fills] == [(i.rank, i.step) for i in frees]
