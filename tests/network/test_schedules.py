"""Exactness under every schedule: hypothesis draws faults (a rank killed, a node lost, a rank
killed while the next generation forms, a node cut off or its packets to the supervisor dropped),
whether a spare waits or the world shrinks, the batch cache and the tiers on or off; each
schedule is a real ``sres run`` on nodes with networks of their own, checked against the
fault-free run bitwise (exact mode: the world's size changes no bit) with every sample trained
exactly once.

``SRES_SCHEDULES`` sets how many are drawn (default 200, the slow set's; CI runs :data:`IN_CI` in
``test_a_few_schedules``). A failing one is printed as its ``sres run`` arguments, to replay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.inprocess.test_elastic import assert_every_sample_once
from tests.network.conftest import EXACT
from tests.support.sres_runs import Run, clean_env, run_command, sres_command

pytestmark = pytest.mark.network

STEPS = 40
NODES = 3
CACHE = ("--batch-cache", "--prefetch", "4")
FAULTS = ("kill", "node", "kill-in-formation", "cut", "drop-out")


@st.composite
def schedules(draw) -> tuple[list[str], tuple[str, ...]]:
    """(``sres run`` options, the training's options) of one schedule."""
    spares = draw(st.integers(0, 1))
    nodes = NODES - spares  # a spare is no node of the run until it takes a rank: not a target
    specs = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(FAULTS))
        step = draw(st.integers(3, 15))  # seen (a lease, 3 s) well before the run ends
        if kind == "kill":
            specs.append(f"kill:rank={draw(st.integers(0, 1))}:step={step}")
        elif kind == "node":
            specs.append(f"node:{draw(st.integers(0, nodes - 1))}:step={step}")
        elif kind == "kill-in-formation":
            specs.append("kill:rank=0:gen=2")
        else:
            specs.append(f"{kind}:{draw(st.integers(0, nodes - 1))}:for=0:step={step}")
    options = ["--min-nodes", "1", *(f"--inject={s}" for s in dict.fromkeys(specs))]
    options += ["--spares", str(spares)] if spares else []
    options += [] if draw(st.booleans()) else ["--no-tiers"]
    train = (*EXACT, "--sleep-s", "0.1", *(CACHE if draw(st.booleans()) else ()))
    return options, train


def model_digests(run: Run) -> set[str]:
    assert run.returncode == 0, run.stderr[-3000:]
    return {json.loads(p.read_text())["model_digest"] for p in (run.log_dir / "out").glob("rank*.json")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> set[str]:
    """The model's bits after the schedule's steps with no fault (exact mode: at any world size)."""
    log_dir = tmp_path_factory.mktemp("reference") / "run"
    cmd = sres_command(log_dir, NODES, ("--no-tiers",), "resilience.examples.train_mlp", STEPS, (*EXACT,))
    return model_digests(run_command(cmd, clean_env(), log_dir, 240))


def check(tmp: Path, net, reference: set[str], options: list[str], train: tuple[str, ...]) -> None:
    net.reset()
    log_dir = tmp / f"run-{len(list(tmp.iterdir()))}"
    members = NODES - int("--spares" in options)
    cmd = sres_command(log_dir, members, tuple(options), "resilience.examples.train_mlp", STEPS, train, 4)
    run = run_command(cmd, clean_env(SRES_NETNS=net.variable), log_dir, 240)
    replay = f"sres run {' '.join(options)} -- ... {' '.join(train)}"
    assert model_digests(run) == reference, replay
    assert_every_sample_once(run.log_dir, STEPS)


def drawn(count: int):
    return settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


IN_CI = 6


@pytest.mark.timeout(120 * IN_CI)
@pytest.mark.parametrize("network", [NODES], indirect=True)
@drawn(IN_CI)
@given(schedule=schedules())
def test_a_few_schedules(tmp_path, network, reference, schedule):
    check(tmp_path, network, reference, *schedule)


SCHEDULES = int(os.environ.get("SRES_SCHEDULES", "200"))


@pytest.mark.slow
@pytest.mark.timeout(120 * SCHEDULES)  # pytest-timeout's limit is for all of hypothesis's examples
@pytest.mark.parametrize("network", [NODES], indirect=True)
@drawn(SCHEDULES)
@given(schedule=schedules())
def test_every_schedule_ends_with_the_fault_free_bits(tmp_path, network, reference, schedule):
    check(tmp_path, network, reference, *schedule)
