"""CI's two lanes, balanced from measured times (tests/support/lanes.py): pure planning."""

from __future__ import annotations

from tests.support.lanes import UNMEASURED_S, balance, load, store


def test_pinned_tests_stay_and_files_go_longest_first_to_the_shorter_lane():
    pinned = {"c.py::a": "slurm", "c.py::b": "slurm"}
    movable = [("x.py::1", "x.py"), ("x.py::2", "x.py"), ("y.py::1", "y.py"), ("z.py::1", "z.py")]
    times = {
        "c.py::a": 100.0,
        "c.py::b": 50.0,
        "x.py::1": 80.0,
        "x.py::2": 40.0,
        "y.py::1": 60.0,
        "z.py::1": 30.0,
    }
    plan = balance(pinned, movable, times, ("local", "slurm"))
    assert plan.lane_of["c.py::a"] == plan.lane_of["c.py::b"] == "slurm"
    assert plan.lane_of["x.py::1"] == plan.lane_of["x.py::2"] == "local"  # a file stays whole
    assert (plan.lane_of["y.py::1"], plan.lane_of["z.py::1"]) == ("local", "slurm")
    assert dict(plan.seconds) == {"local": 180.0, "slurm": 180.0}


def test_an_unmeasured_test_counts_as_a_typical_one_and_the_plan_is_the_same_every_time():
    movable = [(f"t{i}.py::t", f"t{i}.py") for i in range(5)]
    plans = [balance({}, list(order), {}, ("local", "slurm")) for order in (movable, movable[::-1])]
    assert plans[0] == plans[1]
    assert sorted(plans[0].seconds.values()) == [2 * UNMEASURED_S, 3 * UNMEASURED_S]


def test_stored_times_merge_with_the_earlier_ones(tmp_path):
    path = tmp_path / "durations.json"
    store({"a.py::t": 1.04, "b.py::t": 2.0}, path)
    store({"b.py::t": 3.0}, path)
    assert load(path) == {"a.py::t": 1.0, "b.py::t": 3.0}
    assert load(tmp_path / "none.json") == {}
