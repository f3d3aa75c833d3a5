"""The neighbour-copy port: only the run's own ranks get a copy written, and nothing anyone else
sends stops the server or removes a genuine copy.

Real sockets and a real server; the attacker has the port (``/proc/net/tcp``) and the job id
(``squeue``), not the run's secret.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading

import pytest
import torch

from resilience.contract import run_secret
from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.budget import CopyCost
from resilience.tiers.same_bits import SameBits
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


def test_receiving_a_copy_is_counted_in_the_receiving_node_s_protection_cost(tmp_path):
    """The protection budget counts the CPU a copy costs where it lands too: a receiver's work
    slows a synchronous step as much as its sender's. Its time is not the copies' wall time
    (the sender's push waits for it, so it is counted there)."""
    ticks = iter(range(1000))
    cost = CopyCost(cpu=lambda: float(next(ticks)), wall=lambda: 0.0)
    receiving = NeighbourServer(tmp_path / "in", "77", keep=1, secret=SECRET, cost=cost).start()
    try:
        cost.protected()
        push_checkpoint(receiving.link, checkpoint(tmp_path / "ram", 5), "77", owner=0, step=5)
    finally:
        receiving.stop()
    assert received(receiving) == [5]
    measured = cost.take()
    assert measured is not None and measured.cpu_s == 1.0 and measured.wall_s == 0.0


def dp_checkpoint(root, step: int, rank: int, weights: float | None = None):
    """A data-parallel rank's RAM-tier copy: the replicated state (the same on every rank unless
    ``weights`` says otherwise) and its own part."""
    replicated = {"w": torch.full((250_000,), float(step if weights is None else weights))}
    own = {"rng": torch.tensor([rank, step])}
    snaps = {"replicated": snapshot.capture(replicated, step), "rank": snapshot.capture(own, step)}
    return mf.write(root, "77", step, 4, rank, snaps)


def test_a_copy_whose_replicated_state_this_node_holds_is_linked_not_sent_and_restores_verified(tmp_path):
    """Pure data parallelism: the next node's own rank has just written the same replicated
    state at the same step. Only the rank's own part crosses the network; the copy still reads
    back with every checksum verified. Where the bits differ, or nothing is held, all is sent."""
    own = tmp_path / "own"
    dp_checkpoint(own, 5, rank=2)  # this node's own rank's copy of step 5
    server = NeighbourServer(tmp_path / "neighbour", "77", keep=2, secret=SECRET, local=own).start()
    try:
        whole = sum(p.stat().st_size for p in dp_checkpoint(tmp_path / "a", 5, rank=0).iterdir())
        sent = push_checkpoint(server.link, tmp_path / "a" / "step-00000005" / "rank-00000", "77", 0, 5)
        replicated = (tmp_path / "a" / "step-00000005" / "rank-00000" / "replicated.bin").stat().st_size
        assert sent < whole - replicated + 1  # the replicated file was not sent
        copy = mf.rank_dir(server.root, 5, 0)
        loaded = mf.load(copy, mf.read_manifest(copy, "77"), verify=True)
        assert loaded["rank"].step == 5 and set(loaded) == {"replicated", "rank"}
        held = mf.rank_dir(own, 5, 2) / "replicated.bin"
        assert (copy / "replicated.bin").stat().st_ino == held.stat().st_ino  # one set of bytes

        differs = dp_checkpoint(tmp_path / "b", 5, rank=1, weights=-1.0)  # a diverged rank
        assert push_checkpoint(server.link, differs, "77", 1, 5) >= replicated
        nothing_held = dp_checkpoint(tmp_path / "c", 6, rank=3)  # no copy of step 6 here yet
        assert push_checkpoint(server.link, nothing_held, "77", 3, 6) >= replicated
        again = dp_checkpoint(tmp_path / "d", 6, rank=0)  # step 6 was just received from rank 3
        assert push_checkpoint(server.link, again, "77", 0, 6) < replicated
    finally:
        server.stop()


def test_a_file_planted_as_a_link_in_the_node_s_own_tier_is_never_linked_into_a_copy(tmp_path):
    """Another user cannot make a copy take their file: only regular files of this user's, named
    by a complete copy's manifest with the same checksum, are linked."""
    own = tmp_path / "own"
    planted = dp_checkpoint(own, 5, rank=2)
    real = tmp_path / "elsewhere.bin"
    (planted / "replicated.bin").rename(real)
    (planted / "replicated.bin").symlink_to(real)
    server = NeighbourServer(tmp_path / "neighbour", "77", keep=1, secret=SECRET, local=own).start()
    try:
        src = dp_checkpoint(tmp_path / "a", 5, rank=0)
        replicated = (src / "replicated.bin").stat().st_size
        assert push_checkpoint(server.link, src, "77", 0, 5) >= replicated
    finally:
        server.stop()
    assert not (mf.rank_dir(server.root, 5, 0) / "replicated.bin").is_symlink()


def test_a_copy_waits_for_the_node_s_own_copy_of_its_step_while_it_is_being_written(tmp_path):
    """Both ranks took the same commit at once; the sender's own write came first, so the
    receiver's may still be under way: the copy waits for it (a bounded time), then links."""
    own, received = tmp_path / "own", tmp_path / "neighbour"
    src = dp_checkpoint(tmp_path / "a", 5, rank=0)
    entry = mf.read_manifest(src, "77").files["replicated.bin"]
    writing = mf.rank_dir(own, 5, 2).with_name(f"rank-00002.tmp-{os.getpid()}")  # a live writer
    writing.mkdir(parents=True)
    now = [0.0]

    def finish_the_write(seconds: float) -> None:  # the node's own rank renames its copy into place
        now[0] += seconds
        if writing.exists():
            shutil.rmtree(writing)
            dp_checkpoint(own, 5, rank=2)

    same = SameBits("77", own, received, clock=lambda: now[0], sleep=finish_the_write)
    to = mf.rank_dir(received, 5, 0).with_name("rank-00000.in-1-1")
    to.mkdir(parents=True)
    assert same.link(5, "replicated.bin", entry, to / "replicated.bin")

    (mf.rank_dir(own, 7, 2).with_name(f"rank-00002.tmp-{os.getpid()}")).mkdir(parents=True)  # it never ends

    def wait(seconds: float) -> None:
        now[0] += seconds

    never = SameBits("77", own, received, clock=lambda: now[0], sleep=wait)
    started = now[0]
    assert not never.link(7, "replicated.bin", entry, to / "other.bin")
    assert now[0] - started >= SameBits.WAIT_S  # gave up after the bound, then the file is sent

    dead = subprocess.Popen(["true"])
    dead.wait()
    (mf.rank_dir(own, 8, 2).with_name(f"rank-00002.tmp-{dead.pid}")).mkdir(parents=True)  # killed mid-write
    started = now[0]
    assert not never.link(8, "replicated.bin", entry, to / "third.bin")
    assert now[0] == started  # its writer is gone: nothing to wait for
