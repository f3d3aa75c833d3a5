"""The liveness server: a rank's death seen at once, and nothing anyone else sends changes that.

Real sockets and a real server thread; the attacker is a plain connection that does not know
the run's secret (what another user on the node has: the port, from /proc/net/tcp).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from resilience.contract import run_secret
from resilience.contract.hello import MAX_HELLO, announce
from resilience.contract.liveness import LivenessServer
from tests.support.waiting import until


pytestmark = pytest.mark.local  # a server thread to wait for; one test spawns the process it kills

SECRET = run_secret.new_secret()


@pytest.fixture
def server():
    s = LivenessServer(SECRET)
    yield s
    s.close()


def attacker(port: int) -> tuple[socket.socket, str]:
    """A connection from someone without the secret, and the challenge it was sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock, sock.makefile("rb").readline().decode().split()[1]


def test_a_killed_process_is_seen_at_once(server):
    code = (
        "import sys, time; from resilience.contract.hello import announce; "
        f"s = announce('127.0.0.1', {server.port}, 'n0p0', {SECRET!r}, '7'); print('up', flush=True); "
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert child.stdout.readline().strip() == "up"
        until(lambda: server.peer("n0p0") is not None)
        assert server.peer("n0p0").step_id == "7" and server.lost_at("n0p0") is None
        child.kill()
        killed = time.monotonic()
        child.wait()
        until(lambda: server.lost_at("n0p0") is not None)
        assert server.lost_at("n0p0") - killed < 1.0
    finally:
        child.kill()
        child.wait()


def test_a_connection_that_never_says_hello_is_ignored(server):
    with socket.create_connection(("127.0.0.1", server.port)):
        pass
    sock = announce("127.0.0.1", server.port, "n1p0", SECRET)
    until(lambda: server.peer("n1p0") is not None)
    assert server.lost_at("n1p0") is None
    sock.close()


def test_a_forged_hello_neither_claims_nor_ends_a_live_ranks_slot(server):
    """The attack: say hello as a live rank, then hang up, so that the supervisor thinks the rank
    died. Without the secret the hello is refused, and the rank stays alive to the server."""
    rank = announce("127.0.0.1", server.port, "n0p0", SECRET, "3")
    until(lambda: server.peer("n0p0") is not None)
    sock, challenge = attacker(server.port)
    with sock:
        sock.sendall(f"n0p0 4 {run_secret.proof('00' * 16, challenge, 'n0p0', '4')}\n".encode())
        assert sock.recv(1) == b""  # closed by the server
    until(lambda: server.take_dropped() == ["hello for n0p0 without the run's secret"])
    assert server.peer("n0p0").step_id == "3" and server.lost_at("n0p0") is None
    rank.close()


def test_an_answer_seen_once_is_worth_nothing_on_the_next_connection(server):
    first, challenge = attacker(server.port)
    first.close()
    replayed = run_secret.proof(SECRET, challenge, "n2p0", "")  # as if recorded from a real rank
    sock, _ = attacker(server.port)
    with sock:
        sock.sendall(f"n2p0  {replayed}\n".encode())
        assert sock.recv(1) == b""
    until(lambda: server.take_dropped() == ["hello for n2p0 without the run's secret"])
    assert server.peer("n2p0") is None


@pytest.mark.parametrize(
    "garbage, why",
    [
        (b"\xff\xfe\x00 not text\n", "not a hello"),
        (b"x" * (MAX_HELLO + 10), "hello longer than a hello"),
        (b"../../etc 1 2\n", "not a hello"),
        (b"n0p0 1\n", "not a hello"),
    ],
)
def test_garbage_is_dropped_and_the_server_goes_on(server, garbage, why):
    sock, _ = attacker(server.port)
    with sock:
        sock.sendall(garbage)
        assert sock.recv(1) == b""
    until(lambda: server.take_dropped() == [why])
    rank = announce("127.0.0.1", server.port, "n0p0", SECRET)  # a real rank still gets in
    until(lambda: server.peer("n0p0") is not None)
    rank.close()
    until(lambda: server.lost_at("n0p0") is not None)


def test_announce_refuses_a_server_that_is_not_ours():
    with socket.create_server(("127.0.0.1", 0)) as impostor:

        def answer() -> None:
            conn, _ = impostor.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\n")
                conn.recv(1)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(ConnectionError, match="is not the run's liveness server"):
            announce("127.0.0.1", impostor.getsockname()[1], "n0p0", SECRET, timeout_s=5)
        thread.join(timeout=5)


def test_the_server_needs_the_runs_secret():
    with pytest.raises(ValueError, match="needs the run's secret"):
        LivenessServer("")


def test_a_flood_of_silent_connections_cannot_keep_a_rank_out(monkeypatch):
    """More unproven connections than the server keeps: the oldest go, and a rank still gets in."""
    monkeypatch.setattr("resilience.contract.liveness.MAX_PENDING", 4)
    server = LivenessServer(SECRET)
    try:
        silent = [attacker(server.port)[0] for _ in range(8)]
        rank = announce("127.0.0.1", server.port, "n0p0", SECRET)
        until(lambda: server.peer("n0p0") is not None)
        assert all(sock.recv(1) == b"" for sock in silent[:4])  # the oldest four were closed
        assert server.lost_at("n0p0") is None
        rank.close()
        for sock in silent:
            sock.close()
    finally:
        server.close()
