"""The control port (sres grow/shrink/resize/status) answers any input with one line and stays up."""

from __future__ import annotations

import json
import socket

import pytest

from launcher.supervisor.control import MAX_REQUEST, ControlServer

pytestmark = pytest.mark.local  # a real server thread


def ask(port: int, raw: bytes) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        return json.loads(sock.makefile("rb").readline())


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"[]\n", "not a JSON object"),
        (b'"resize"\n', "not a JSON object"),
        (b"\xff\xfe\n", "bad request"),
        (b"{" + b" " * (2 * MAX_REQUEST) + b"}\n", "bad request"),
    ],
)
def test_malformed_requests_get_one_line_and_the_server_goes_on(tmp_path, raw, says):
    server = ControlServer(tmp_path)
    try:
        port = json.loads((tmp_path / "control.json").read_text())["port"]
        reply = ask(port, raw)
        assert reply["ok"] is False and says in reply["message"]
        token = (tmp_path / "control.token").read_text()
        bad_count = {"token": token, "op": "grow", "by": [1]}
        assert "bad request" in ask(port, json.dumps(bad_count).encode() + b"\n")["message"]
        assert "wrong token" in ask(port, b'{"op": "grow", "by": 1}\n')["message"]
    finally:
        server.close()
