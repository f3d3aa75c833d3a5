"""The neighbour-copy port: only the run's own ranks get a copy written, and nothing anyone else
sends stops the server or removes a genuine copy.

Real sockets and a real server; the attacker has the port (``/proc/net/tcp``) and the job id
(``squeue``), not the run's secret.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading

import pytest
import torch

from resilience.contract import run_secret
from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.transport import (
    MAX_UNPROVEN,
    MAX_HEADER,
    NeighbourLink,
    NeighbourServer,
    _proof,
    push_checkpoint,
)
from tests.support.waiting import until


pytestmark = pytest.mark.local  # a server thread to wait for

SECRET = run_secret.new_secret()


@pytest.fixture
def server(tmp_path):
    s = NeighbourServer(tmp_path / "neighbour", "77", keep=1, secret=SECRET).start()
    yield s
    s.stop()


def checkpoint(root, step: int, rank: int = 0):
    state = {"w": torch.full((1000,), float(step)), "step": step}
    return mf.write(root, "77", step, 2, rank, {"replicated": snapshot.capture(state, step)})


def received(server: NeighbourServer) -> list[int]:
    return mf.steps_in(server.root)


def attacker(server: NeighbourServer) -> tuple[socket.socket, str]:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    greeting, _, challenge = sock.makefile("rb").readline().strip().partition(b" ")
    assert greeting == b"sres-neighbour"
    return sock, challenge.decode()


def test_the_runs_own_copy_arrives_and_verifies(server, tmp_path):
    src = checkpoint(tmp_path / "ram", 5)
    sent = push_checkpoint(server.link, src, "77", 0, 5)
    assert sent > 4000 and received(server) == [5]
    m = mf.read_manifest(mf.rank_dir(server.root, 5, 0), "77", 2)
    mf.verify(mf.rank_dir(server.root, 5, 0), m)


def test_a_forged_newer_step_is_refused_and_the_genuine_copy_stays(server, tmp_path):
    push_checkpoint(server.link, checkpoint(tmp_path / "ram", 5), "77", 0, 5)
    forged = checkpoint(tmp_path / "evil", 99999999)
    with pytest.raises(ConnectionError):
        push_checkpoint(NeighbourLink(server.address, run_secret.new_secret()), forged, "77", 0, 99999999)
    until(lambda: server.refused)
    assert "secret" in server.refused[-1]
    assert received(server) == [5]  # nothing written, nothing pruned


def test_a_replayed_header_fails_on_the_next_connection(server, tmp_path):
    src = checkpoint(tmp_path / "ram", 6)
    files = sorted(src.iterdir(), key=lambda p: (p.name == mf.MANIFEST, p.name))
    sock, challenge = attacker(server)
    header = {
        "job": "77",
        "owner": 0,
        "step": 6,
        "files": [[p.name, p.stat().st_size] for p in files],
        "manifest": hashlib.sha256(files[-1].read_bytes()).hexdigest(),
    }
    header["proof"] = _proof(SECRET, challenge, header)  # what a sniffer saw once
    sock.close()
    replay, _ = attacker(server)
    replay.sendall(json.dumps(header).encode() + b"\n" + b"".join(p.read_bytes() for p in files))
    replay.shutdown(socket.SHUT_WR)
    assert replay.makefile("rb").readline() == b""
    until(lambda: server.refused)
    assert received(server) == []


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff\xfe not json\n",
        b"[1, 2, 3]\n",
        b"x" * (MAX_HEADER + 10) + b"\n",
        b'{"job": "77", "owner": 0, "step": 1, "files": [], "manifest": "", "proof": "00"}\n',
        b"",
    ],
    ids=["not-utf8", "not-an-object", "oversized", "wrong-proof", "silent-hangup"],
)
def test_garbage_is_refused_and_the_next_real_copy_arrives(server, tmp_path, garbage):
    sock, _ = attacker(server)
    sock.sendall(garbage)
    sock.shutdown(socket.SHUT_WR)
    assert sock.makefile("rb").readline() == b""
    until(lambda: server.refused)
    push_checkpoint(server.link, checkpoint(tmp_path / "ram", 3), "77", 0, 3)
    assert received(server) == [3]


def test_a_flood_of_silent_connections_never_keeps_a_rank_out(server, tmp_path):
    """Past the budget of unproven connections the oldest is cut, not the newest: a rank's copy
    gets in while the flood is still open (16 silent connections once held every slot for a
    whole run), and the server holds no more than the budget."""
    flood = [attacker(server)[0] for _ in range(2 * MAX_UNPROVEN)]
    push_checkpoint(server.link, checkpoint(tmp_path / "ram", 4), "77", 0, 4)
    assert received(server) == [4]
    assert len(server.unproven) <= MAX_UNPROVEN
    oldest = flood[0]
    oldest.settimeout(5)
    assert oldest.recv(1) == b""  # cut: the server's end is shut
    for sock in flood:
        sock.close()


def test_a_server_that_is_not_ours_gets_no_header(tmp_path):
    impostor = socket.create_server(("127.0.0.1", 0))
    port = impostor.getsockname()[1]

    def serve() -> None:
        conn, _ = impostor.accept()
        conn.sendall(b"HTTP/1.1 200 OK\n")
        got.append(conn.recv(4096))
        conn.close()

    got: list[bytes] = []
    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(ValueError, match="not a neighbour server"):
        push_checkpoint(
            NeighbourLink(f"127.0.0.1:{port}", SECRET), checkpoint(tmp_path / "ram", 1), "77", 0, 1
        )
    t.join(5)
    impostor.close()
    assert got == [b""]
