"""Straggler detection from per-rank compute times (pure), and the policy's answer to one."""

from __future__ import annotations

import pytest

from launcher.observability.straggler import Straggler, StragglerConfig, StragglerDetector
from launcher.supervisor.observe.step_reports import StepLog, StepReports, read_file
from launcher.supervisor.observe.view import RankStep
from resilience.contract.messages import RecentSteps, StepRecord


def feed(
    detector: StragglerDetector, steps: range, slow: dict[int, float], ranks=(0, 1, 2, 3)
) -> list[Straggler]:
    found = []
    for step in steps:
        found += detector.observe(set(ranks), {r: {step: 0.1 * slow.get(r, 1.0)} for r in ranks})
    return found


def test_a_rank_slow_for_the_streak_is_reported_once():
    d = StragglerDetector(StragglerConfig(factor=1.5, steps=5))
    assert feed(d, range(0, 10), {}) == []
    found = feed(d, range(10, 30), {2: 3.0})
    # the running median turns at the third slow step (12); five slow scores in a row from there
    assert found == [Straggler(rank=2, score=pytest.approx(3.0), step=16)]
    assert d.scores[2] == pytest.approx(3.0) and d.scores[0] == pytest.approx(1.0)


def test_odd_steps_neither_break_a_streak_nor_start_one():
    d = StragglerDetector(StragglerConfig(factor=1.5, steps=5))
    assert feed(d, range(0, 10), {}) == []
    assert feed(d, range(10, 12), {0: 4.0, 1: 4.0}) == []  # two busy steps on two ranks: no alarm
    assert feed(d, range(12, 16), {3: 2.0}) == []
    assert feed(d, range(16, 17), {}) == []  # one fast step of the slow rank...
    assert feed(d, range(17, 18), {2: 3.0, 3: 2.0}) == []  # ...or one spike of another: still slow
    assert [s.rank for s in feed(d, range(18, 19), {3: 2.0})] == [3]


def test_a_lasting_recovery_breaks_the_streak():
    d = StragglerDetector(StragglerConfig(factor=1.5, steps=8))
    assert feed(d, range(0, 5), {}) == []
    assert feed(d, range(5, 10), {1: 2.0}) == []  # the running median is slow at steps 7-11: 5 steps
    assert feed(d, range(10, 17), {}) == []
    assert feed(d, range(17, 26), {1: 2.0}) == []  # slow again from step 19: 7 in a row
    assert [s.step for s in feed(d, range(26, 27), {1: 2.0})] == [26]


def test_steps_are_judged_when_every_member_reported_them_in_order():
    d = StragglerDetector(StragglerConfig(factor=1.5, steps=1))
    assert d.observe({0, 1}, {0: {0: 0.1, 1: 0.9}}) == []  # rank 1 has not reported yet
    found = d.observe({0, 1}, {1: {0: 0.1, 1: 0.1}})
    assert [(s.rank, s.step) for s in found] == [(0, 1)]
    assert d.observe({0, 1}, {0: {1: 9.0}, 1: {1: 0.1}}) == []  # step 1 was judged already


@pytest.mark.parametrize("bad", [dict(factor=1.0), dict(steps=0), dict(action="drain")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        StragglerConfig(**bad)


class _Steps:
    """A store holding each (generation, slot)'s recent steps: its progress channel is all
    StepReports reads."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, str], list[StepRecord]] = {}
        self.progress = self

    def add(self, generation: int, slot: str, step: int) -> None:
        self.records.setdefault((generation, slot), []).append(StepRecord(step, 0.1, 0.2, 100.0 + step, 0.0))

    def recent_steps(self, generation: int, slot: str) -> RecentSteps | None:
        found = self.records.get((generation, slot))
        return RecentSteps(tuple(found)) if found else None


def test_a_new_generation_first_takes_the_old_one_s_last_steps():
    """Steps made between the last look and a fault belong to the run's record (the goodput
    account would see a hole before every recovery without them)."""
    store = _Steps()
    reports = StepReports(store, StragglerConfig())  # type: ignore[arg-type]
    for step in (0, 1):
        store.add(1, "a", step)
        store.add(1, "b", step)
    assert [(s.generation, s.record.step) for s in reports.read(1, {0: "a", 1: "b"})[0]] == [
        (1, 0),
        (1, 1),
        (1, 0),
        (1, 1),
    ]
    store.add(1, "a", 2)  # made after that look; then "b" died and generation 2 began
    store.add(2, "a", 2)
    store.add(2, "c", 2)
    got = [(s.generation, s.slot, s.record.step) for s in reports.read(2, {0: "a", 1: "c"})[0]]
    assert got == [(1, "a", 2), (2, "a", 2), (2, "c", 2)]


def test_a_step_line_reads_back_as_the_record_the_rank_sent(tmp_path):
    """Lines are formatted, not json.dumps-ed (thousands a second at scale): each field in its
    place, and a record whose values cannot be written so never reaches the writer."""
    record = StepRecord(7, 0.123456, 0.5, 1795876223.9803543, 1e-06)
    StepLog(tmp_path).append([RankStep(3, 12, 'n1"p4', record)])
    assert read_file(tmp_path) == [
        {"generation": 3, "rank": 12, "slot": 'n1"p4', "step": 7, "t": 1795876223.9803543}
        | {"compute_s": 0.123456, "step_s": 0.5, "blocked_s": 1e-06}
    ]
    wrong_ones = (
        "[[7, 0.1, NaN, 1.0, 0.0, 1]]",
        "[[7, 1, 0.5, 1.0, 0.0, 1]]",
        '[["7", 0.1, 0.5, 1.0, 0.0, 1]]',
    )
    for wrong in (*wrong_ones, "[[7, 0.1, 0.5, 1.0, 0.0]]", "[[7, 0.1, 0.5, 1.0, 0.0, true]]"):
        with pytest.raises(ValueError):
            RecentSteps.decode(wrong)


def test_a_window_record_is_written_with_its_steps_and_a_streak_counts_steps_not_records(tmp_path):
    """Past 512 ranks a record stands for a window of steps: its line says how many, and
    ``--straggler-steps 20`` is still 20 steps of the run (three windows of 8)."""
    StepLog(tmp_path).append([RankStep(1, 0, "n0p0", StepRecord(16, 0.8, 4.0, 100.0, 0.0, 8))])
    assert read_file(tmp_path)[0]["steps"] == 8
    d = StragglerDetector(StragglerConfig(factor=1.5, steps=20), window=8)
    found = feed(d, range(8, 80, 8), {2: 3.0})
    assert [(s.rank, s.step) for s in found] == [(2, 24)]  # slow from the start: its third window
