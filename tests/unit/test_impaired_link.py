"""The impaired link's rule for each frame (pure: a seeded draw and a given clock); the forwarder
itself runs in tests/network/test_partitions.py, on real links."""

import random

import pytest

from launcher.placement.impaired_link import Direction, Impairment


def carried(impairment: Impairment, frames: int, seed: int = 0) -> tuple[Direction, list[bytes]]:
    sent: list[bytes] = []
    way = Direction(impairment, random.Random(seed), sent.append)
    for n in range(frames):
        way.take(n.to_bytes(4, "big"), now=0.0)
    return way, sent


def test_a_share_of_the_frames_is_lost_and_the_rest_arrive_in_their_order():
    way, sent = carried(Impairment(loss=0.05), 10_000)
    assert way.flush(now=0.0) is None and way.passed == len(sent)
    assert 400 < way.dropped < 600 and way.dropped + way.passed == 10_000
    assert sent == sorted(sent)


def test_a_delayed_frame_waits_its_time_and_says_how_long_is_left():
    way, sent = carried(Impairment(delay_s=0.05), 3)
    assert way.flush(now=0.02) == pytest.approx(0.03) and sent == []
    assert way.flush(now=0.05) is None and len(sent) == 3


def test_a_frame_the_far_end_cannot_take_is_counted_lost():
    def refuse(frame: bytes) -> None:
        raise OSError("network is down")

    way = Direction(Impairment(), random.Random(0), refuse)
    way.take(b"frame", now=0.0)
    assert way.flush(now=0.0) is None and (way.passed, way.dropped) == (0, 1)


@pytest.mark.parametrize("bad", [{"loss": -0.1}, {"loss": 1.0}, {"delay_s": -1.0}])
def test_an_impossible_impairment_is_refused(bad):
    with pytest.raises(ValueError):
        Impairment(**bad)
