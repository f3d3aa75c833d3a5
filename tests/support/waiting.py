"""Waiting for a condition a server thread brings about, without sleeping longer than it takes."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
