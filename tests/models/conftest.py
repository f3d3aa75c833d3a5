"""The zoo's fault-free references (tests.support.zoo_runs), one per case and session."""

from __future__ import annotations

import pytest

from tests.support.zoo_runs import References


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> References:
    return References(tmp_path_factory)
