"""Training jobs on the real local Slurm cluster, supervised by ``sres srun``; real node deaths."""

from __future__ import annotations

import sys

import pytest

from slurm_plugins.spank.build import build, plugstack_line
from tests.support.training_jobs import REPO

pytestmark = pytest.mark.cluster


@pytest.fixture
def plugin(cluster, tmp_path_factory):
    """The plugin installed in the test cluster's plugstack.conf (one line), removed afterwards."""
    out = tmp_path_factory.mktemp("spank")
    so = build(out)
    sres = out / "sres"  # what an installed console script does, for the repository under test
    sres.write_text(f'#!/bin/sh\nexport PYTHONPATH={REPO}\nexec {sys.executable} -m launcher.entry "$@"\n')
    sres.chmod(0o755)
    cluster.plugstack_path.write_text(plugstack_line(so, str(sres)) + "\n")
    yield so
    cluster.plugstack_path.write_text("")
