"""The budget of connections that have not proved the run's secret: the oldest goes first, a
late one goes at the next accept, a proven one never does."""

from __future__ import annotations

import errno
import socket

import pytest

from resilience.contract.unproven import UnprovenConnections


def _pair() -> tuple[socket.socket, socket.socket]:
    server, client = socket.socketpair()
    client.settimeout(0.05)  # a cut one answers at once
    return server, client


def _cut(client: socket.socket) -> bool:
    try:
        return client.recv(1) == b""
    except TimeoutError:
        return False


def test_past_the_limit_the_oldest_is_cut_and_a_proven_one_never():
    now = [0.0]
    budget = UnprovenConnections(2, 10.0, clock=lambda: now[0])
    pairs = [_pair() for _ in range(4)]
    budget.admit(pairs[0][0])
    budget.admit(pairs[1][0])
    budget.proved(pairs[0][0])  # proved: out of the budget
    budget.admit(pairs[2][0])
    budget.admit(pairs[3][0])  # over the limit: the oldest unproven (1) goes
    assert [_cut(c) for _, c in pairs] == [False, True, False, False]
    assert len(budget) == 2 and budget.cut == 1


def test_a_connection_past_its_deadline_is_cut_at_the_next_accept():
    now = [0.0]
    budget = UnprovenConnections(8, 5.0, clock=lambda: now[0])
    slow, fresh = _pair(), _pair()
    budget.admit(slow[0])
    now[0] = 6.0
    budget.admit(fresh[0])
    assert _cut(slow[1]) and not _cut(fresh[1])
    assert len(budget) == 1 and budget.cut == 1


@pytest.mark.parametrize(("limit", "deadline"), [(0, 1.0), (1, 0.0), (1, float("nan"))])
def test_a_budget_without_room_or_time_is_refused(limit, deadline):
    with pytest.raises(ValueError):
        UnprovenConnections(limit, deadline)


class _Listening:
    """A listening socket out of descriptors ``busy`` times, then with one connection, then closed."""

    def __init__(self, busy: int) -> None:
        self.busy, self.pair = busy, _pair()

    def accept(self):
        if self.busy:
            self.busy -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        if self.pair is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        conn, self.pair = self.pair[0], None
        return conn, ("127.0.0.1", 0)


def test_accept_waits_out_descriptor_exhaustion_admits_and_ends_when_closed():
    budget, waits = UnprovenConnections(4, 5.0), []
    server = _Listening(busy=3)
    conn = budget.accept(server, sleep=waits.append)
    assert conn is not None and len(budget) == 1 and waits == [0.05] * 3
    assert budget.accept(server, sleep=waits.append) is None
