"""Keeps the ``unit`` tier's promise: pure logic, no subprocess, no sleep, the whole tier under 60 s.

A test marked ``unit`` that starts a process (``subprocess``, ``os.fork``, ``multiprocessing``,
``torch.multiprocessing.spawn``) or calls ``time.sleep`` for more than 0.05 s fails, naming the call:
such a test belongs to ``local`` (``@pytest.mark.local``). Threads may run; calls from threads older
than the test are not its own. Enabled from tests/conftest.py; all it patches is restored per test.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

SLEEP_LIMIT_S = 0.05
"""The longest ``time.sleep`` a unit test may call (a yield to a thread, not a wait)."""

_ELDERS = pytest.StashKey[set[threading.Thread]]()
"""The threads running before a test's setup: theirs are not the test's calls."""

_PROCESS_STARTS = ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp")
"""The ``os`` functions that start a process (``os.spawn*`` goes through ``os.fork``)."""


class _Guard:
    """What one unit test did that the tier forbids, and the patched functions that notice it."""

    def __init__(self, nodeid: str, elders: set[threading.Thread]) -> None:
        self.nodeid = nodeid
        self.found: list[str] = []
        self.elders = elders
        self.active = True

    def refuse(self, what: str) -> None:
        """Records ``what`` and stops the calling thread's work there; a no-op for an older thread."""
        if not self.active or threading.current_thread() in self.elders:
            return
        self.found.append(what)
        pytest.fail(self.message(), pytrace=False)

    def message(self) -> str:
        seen = "; ".join(dict.fromkeys(self.found))
        return (
            f"{self.nodeid} is marked unit (pure logic: no subprocess, no sleep) but it did: {seen}. "
            "Mark it @pytest.mark.local (tests/support/tier_guard.py)."
        )

    def forbid(self, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def forbidden(*args: Any, **kwargs: Any) -> Any:
            self.refuse(what)
            return original(*args, **kwargs)

        return forbidden

    def popen_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init(popen: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
            self.refuse(f"started a process, subprocess.Popen({str(args)[:80]})")
            original(popen, args, *rest, **kwargs)

        return init

    def sleep(self, original: Callable[[float], None]) -> Callable[[float], None]:
        def sleep(seconds: float) -> None:
            if seconds > SLEEP_LIMIT_S:
                self.refuse(f"time.sleep({seconds}) (more than {SLEEP_LIMIT_S} s)")
            original(seconds)

        return sleep


def _patches(guard: _Guard) -> list[tuple[Any, str, Callable[..., Any]]]:
    """(owner, name, stand-in) for each function that starts a process or sleeps."""
    patches: list[tuple[Any, str, Callable[..., Any]]] = [
        (subprocess.Popen, "__init__", guard.popen_init(subprocess.Popen.__init__)),
        (time, "sleep", guard.sleep(time.sleep)),
    ]
    for name in _PROCESS_STARTS:
        if hasattr(os, name):
            patches.append((os, name, guard.forbid(f"started a process, os.{name}", getattr(os, name))))
    start = multiprocessing.process.BaseProcess.start
    what = "started a multiprocessing process"
    patches.append((multiprocessing.process.BaseProcess, "start", guard.forbid(what, start)))
    torch_mp = sys.modules.get("torch.multiprocessing")  # never imported here: only patched if in use
    for name in ("spawn", "start_processes"):
        if torch_mp is not None and callable(getattr(torch_mp, name, None)):
            what = f"started processes, torch.multiprocessing.{name}"
            patches.append((torch_mp, name, guard.forbid(what, getattr(torch_mp, name))))
    return patches


@contextmanager
def _installed(guard: _Guard) -> Iterator[None]:
    """The stand-ins in place while the phase runs, the originals back after it. One that the test
    patched over in turn is left to the test's own undo; it only passes calls through from then on."""
    patches = [(owner, name, getattr(owner, name), stand_in) for owner, name, stand_in in _patches(guard)]
    for owner, name, _, stand_in in patches:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        guard.active = False
        for owner, name, original, stand_in in patches:
            if getattr(owner, name) is stand_in:
                setattr(owner, name, original)


def _guarded(item: pytest.Item) -> Generator[None, Any, Any]:
    """The body of a hook wrapper: the phase runs with the guard on, for a ``unit`` test only."""
    if item.get_closest_marker("unit") is None:
        return (yield)
    elders = item.stash.setdefault(_ELDERS, set(threading.enumerate()) - {threading.current_thread()})
    guard = _Guard(item.nodeid, elders)
    result = None
    with _installed(guard):
        try:
            result = yield
        except BaseException:
            if not guard.found:
                raise
    if guard.found:  # also when the code under test swallowed the failure, or a thread hit it
        pytest.fail(guard.message(), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    """Fixtures count: a unit test's fixture that starts a server process is the test's."""
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))
