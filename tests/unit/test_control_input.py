"""The control port (sres grow/shrink/resize/status) answers any input with one line and stays up."""

from __future__ import annotations

import json
import os
import socket

import pytest

from launcher.errors import ControlError
from launcher.supervisor.control import MAX_REQUEST, ControlServer, send

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


@pytest.fixture
def run_dir(tmp_path):
    """A live run's dir as its supervisor writes it."""
    server = ControlServer(tmp_path)
    (tmp_path / "events.jsonl").write_text("")
    yield tmp_path
    server.close()


def test_a_linked_token_is_not_followed(run_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "secret"
    elsewhere.write_text("not a token")
    (run_dir / "control.token").unlink()
    (run_dir / "control.token").symlink_to(elsewhere)
    with pytest.raises(ControlError, match="control.token"):
        send(str(run_dir), "status")


def test_a_token_of_another_user_is_not_read(run_dir):
    os.chown(run_dir / "control.token", 65534, 65534)
    with pytest.raises(ControlError, match="not a file of the run's user"):
        send(str(run_dir), "status", owner=os.geteuid())


def test_a_run_dir_not_of_the_jobs_user_is_refused(run_dir):
    """``--job J`` names the job's user: a run dir (from the job's Comment) that is not that
    user's is not read, whoever asks (root asks as that user)."""
    with pytest.raises(ControlError, match="only the run's user may control it"):
        send(str(run_dir), "status", owner=65534)


def test_the_token_goes_to_loopback_only(run_dir):
    address = json.loads((run_dir / "control.json").read_text())
    (run_dir / "control.json").write_text(json.dumps({**address, "host": "10.1.2.3"}))
    with pytest.raises(ControlError, match="loopback only"):
        send(str(run_dir), "status")
    (run_dir / "control.json").write_text("[1, 2]")
    with pytest.raises(ControlError, match="not an address the supervisor wrote"):
        send(str(run_dir), "status")
