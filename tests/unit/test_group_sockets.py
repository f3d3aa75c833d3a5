"""Which sockets a generation's release shuts down: real sockets of this process."""

from __future__ import annotations

import socket

from resilience.agent.abort import GroupSockets


def _connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def _still_open(sock: socket.socket) -> bool:
    try:
        sock.sendall(b"x")
        return True
    except OSError:
        return False


def test_release_before_the_formation_began_shuts_nothing():
    """Found by the 500-fault soak (seed 1, generation 400): a newer plan was seen between
    registering the generation's sockets and entering them, and the release shut down every
    connected socket of the rank, its store connection included (it then died of a broken pipe)."""
    store_like, peer = _connected_pair()
    try:
        assert GroupSockets().shutdown() == 0
        assert _still_open(store_like)
    finally:
        store_like.close()
        peer.close()


def test_release_shuts_only_what_the_generation_opened():
    old, old_peer = _connected_pair()
    sockets = GroupSockets()
    with sockets:
        new, new_peer = _connected_pair()
    try:
        assert sockets.shutdown() >= 1
        assert _still_open(old) and not _still_open(new)
    finally:
        for s in (old, old_peer, new, new_peer):
            s.close()
