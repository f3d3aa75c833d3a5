"""The network tests' fixtures: nodes in namespaces of their own (``tests/support/netns.py``) and
the bits a run on them must end with."""

from __future__ import annotations

import pytest

from tests.support.netns import network  # noqa: F401 - a fixture, found by pytest here
from tests.support.sres_runs import sres_run

EXACT = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "2", "--ddp", "exact")
TRAIN = (*EXACT, "--sleep-s", "0.15")
STEPS = 40


@pytest.fixture(scope="package")
def uncut(tmp_path_factory) -> set[str]:
    """The same run on one loopback, nothing cut: the bits every run with a network fault must
    end with (exact mode: the world's size and who holds which rank change nothing)."""
    run = sres_run(tmp_path_factory.mktemp("uncut"), "--no-tiers", nodes=2, steps=STEPS, train_args=TRAIN)
    assert run.returncode == 0, run.stderr
    return set(run.digests().values())
