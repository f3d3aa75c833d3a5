"""A copy left behind by a generation's end never reads the live objects the next one trains on."""

from __future__ import annotations

import threading

import pytest

from resilience.agent.live_read import LiveRead
from resilience.errors import ReadClosed, ResilienceError


def test_a_read_after_the_close_is_refused():
    live = LiveRead()
    with live.reading():
        pass
    live.close()
    with pytest.raises(ReadClosed), live.reading():
        pytest.fail("read after the generation ended")


def test_the_close_waits_for_a_read_under_way():
    live, inside, go, order = LiveRead(), threading.Event(), threading.Event(), []

    def copy() -> None:
        with live.reading():
            inside.set()
            go.wait()
            order.append("read")

    def end() -> None:
        live.close()
        order.append("closed")

    reader, closer = threading.Thread(target=copy), threading.Thread(target=end)
    reader.start()
    inside.wait()
    closer.start()
    closer.join(timeout=0.02)
    assert closer.is_alive() and order == []
    go.set()
    for thread in (reader, closer):
        thread.join()
    assert order == ["read", "closed"]


def test_a_read_stuck_past_the_timeout_makes_the_close_raise():
    live, inside, release = LiveRead(), threading.Event(), threading.Event()

    def stuck() -> None:
        with live.reading():
            inside.set()
            release.wait()

    thread = threading.Thread(target=stuck)
    thread.start()
    inside.wait()
    with pytest.raises(ResilienceError, match="still reads the live state"):
        live.close(timeout_s=0.1)
    release.set()
    thread.join()
