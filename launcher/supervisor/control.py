"""Controlling a running job: ``sres resize/grow/shrink/status`` talk to its supervisor.

The supervisor listens on a loopback TCP port and writes ``control.json`` (address) and
``control.token`` (a random secret, mode 0600) into the run's log dir: only a user who can
read the token (the run's own user, or root) is obeyed. A request is one JSON line; it is
queued for the supervisor's loop, where the policy answers it like any other observation,
and the answer goes back as one JSON line.
"""

from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import ControlError, Unreachable
from launcher.privileges import call_as
from launcher.supervisor.observe.view import Request
from resilience.contract.own_file import read_own
from resilience.contract.unproven import UnprovenConnections
from resilience.contract.run_dir import CONTROL_ADDRESS, CONTROL_TOKEN, RunDir
from resilience.private_paths import NotPrivate, check_private

ADDRESS_FILE = CONTROL_ADDRESS
"""The address file's name (:attr:`RunDir.control_address`)."""
TOKEN_FILE = CONTROL_TOKEN
"""The token file's name (:attr:`RunDir.control_token`)."""
OPS = ("status", "resize", "grow", "shrink")
ANSWER_TIMEOUT_S = 30.0
MAX_REQUEST = 4096
"""A request is one short JSON line; the rest of a longer one is not read."""
MAX_UNPROVEN = 32
REQUEST_DEADLINE_S = 5.0
"""A connection sends its request line, with the token, within this long of its accept (the
client sends it at once); until then it is one of at most :data:`MAX_UNPROVEN`
(:mod:`resilience.contract.unproven`)."""


@dataclass
class _Pending:
    request: Request
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] = field(default_factory=dict)


class ControlServer:
    """Accepts requests on a thread; the supervisor's loop takes them with :meth:`take` and
    replies with :meth:`answer`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.files = RunDir(self.log_dir)
        self.token = secrets.token_hex(16)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._pending: dict[int, _Pending] = {}
        self._next = 0
        self._lock = threading.Lock()
        self.unproven = UnprovenConnections(MAX_UNPROVEN, REQUEST_DEADLINE_S)
        token_path = self.files.control_token
        token_path.unlink(missing_ok=True)
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        address = {"host": "127.0.0.1", "port": self._sock.getsockname()[1], "pid": os.getpid()}
        self.files.control_address.write_text(json.dumps(address))
        self._thread = threading.Thread(target=self._serve, name="sres-control", daemon=True)
        self._thread.start()

    def take(self) -> tuple[Request, ...]:
        out: list[Request] = []
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return tuple(out)
            self._pending[pending.request.id] = pending
            out.append(pending.request)

    def answer(self, request: int, ok: bool, message: str, **extra: Any) -> None:
        pending = self._pending.pop(request, None)
        if pending is not None:
            pending.answer = {"ok": ok, "message": message, **extra}
            pending.done.set()

    def close(self, message: str = "the run has ended") -> None:
        self._sock.close()
        for pending in list(self._pending.values()):
            self.answer(pending.request.id, False, message)
        self.files.control_address.unlink(missing_ok=True)

    def _serve(self) -> None:
        while (conn := self.unproven.accept(self._sock)) is not None:
            threading.Thread(target=self._one, args=(conn,), daemon=True, name="sres-control-conn").start()

    def _one(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer(conn)
        finally:
            self.unproven.forget(conn)

    def _answer(self, conn: socket.socket) -> None:
        try:
            request = json.loads(conn.makefile("rb").readline(MAX_REQUEST) or b"{}")
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            if self._proves(request):
                self.unproven.proved(conn)
                conn.settimeout(ANSWER_TIMEOUT_S)
            reply = self._handle(request)
        except (OSError, ValueError, TypeError) as err:  # from anyone on the host: input, not a crash
            reply = {"ok": False, "message": f"bad request: {err}"}
        try:
            conn.sendall((json.dumps(reply) + "\n").encode())
        except OSError:
            pass

    def _proves(self, msg: dict[str, Any]) -> bool:
        return hmac.compare_digest(str(msg.get("token", "")), self.token)

    def _handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        if not self._proves(msg):
            return {
                "ok": False,
                "message": "refused: wrong token for this run (only the run's user may control it)",
            }
        op = msg.get("op")
        if op not in OPS:
            return {"ok": False, "message": f"unknown request {op!r}: one of {', '.join(OPS)}"}
        with self._lock:
            self._next += 1
            request = Request(self._next, op, _count(msg.get("nodes")), _count(msg.get("by")))
        if op == "resize" and request.nodes is None or op in ("grow", "shrink") and not request.by:
            return {"ok": False, "message": f"{op}: needs a positive count"}
        pending = _Pending(request)
        self._queue.put(pending)
        if not pending.done.wait(ANSWER_TIMEOUT_S):
            return {"ok": False, "message": f"the supervisor did not answer within {ANSWER_TIMEOUT_S:g} s"}
        return pending.answer


def _count(value: Any) -> int | None:
    if value is None:
        return None
    count = int(value)
    if count < 1:
        raise ValueError(f"{value}: a count must be at least 1")
    return count


# --- the client side (sres resize/grow/shrink/status) -----------------------------------------------


def find_run(run: str) -> Path:
    """A run's log dir from what the user typed: the dir itself, or its name under sres-runs/."""
    for candidate in (Path(run), Path("sres-runs") / run, Path("sres-runs") / f"run-{run}"):
        if RunDir(candidate).events.exists() or RunDir(candidate).control_address.exists():
            return candidate
    raise Unreachable(f"no run at {run!r}: give its log dir (printed at start) or its name under sres-runs/")


def send(
    run: str, op: str, timeout_s: float = ANSWER_TIMEOUT_S + 5, owner: int | None = None, **fields: Any
) -> dict[str, Any]:
    """One request to a running job's supervisor; raises ControlError with one line when it
    cannot be delivered (finished or unknown run, no permission).

    ``owner``: the user whose run this must be (``--job J``: the job's user, from Slurm);
    default the run dir's owner. Root sending to another user's run does it as that user
    (:mod:`launcher.privileges`): the run dir is that user's to arrange, and root must not read
    through a link planted there. The run dir must be the sender's (after that) own directory,
    the token a regular file of theirs, opened without following a link, and it goes only to
    a loopback address, where supervisors listen."""
    log_dir = find_run(run)
    owner = os.lstat(log_dir).st_uid if owner is None else owner
    if os.geteuid() == 0 and owner != 0:
        answer: dict[str, Any] = call_as(owner, lambda: _send(log_dir, op, timeout_s, fields))
        return answer
    return _send(log_dir, op, timeout_s, fields)


def _send(log_dir: Path, op: str, timeout_s: float, fields: dict[str, Any]) -> dict[str, Any]:
    try:
        check_private(log_dir)
    except NotPrivate as err:
        raise ControlError(f"run {log_dir}: {err}; only the run's user may control it") from None
    ended = _ended(log_dir)
    address_path = RunDir(log_dir).control_address
    if ended or not address_path.exists():
        raise ControlError(f"run {log_dir} has {ended or 'ended'}: nothing to control")
    token = _read_own(RunDir(log_dir).control_token, "the run's token")
    try:
        address = json.loads(_read_own(address_path, "the run's address"))
        host, port = str(address["host"]), int(address["port"])
    except (ValueError, TypeError, KeyError):
        raise ControlError(f"run {log_dir}: {ADDRESS_FILE} is not an address the supervisor wrote") from None
    if host not in LOOPBACK or not 0 < port < 65536:
        raise ControlError(
            f"run {log_dir}: {ADDRESS_FILE} names {host}:{port}; a token goes to loopback only"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall((json.dumps({"token": token, "op": op, **fields}) + "\n").encode())
            line = conn.makefile("r").readline()
    except OSError as err:
        raise Unreachable(f"run {log_dir}: its supervisor does not answer ({err}); has it ended?") from None
    if not line:
        raise ControlError(f"run {log_dir}: its supervisor closed the connection; has it ended?")
    answer: dict[str, Any] = json.loads(line)  # one JSON object per answer (ControlServer._one)
    return answer


LOOPBACK = ("127.0.0.1", "::1", "localhost")
"""Where a supervisor's control port listens (:class:`ControlServer`); a token goes nowhere else."""


def _read_own(path: Path, what: str) -> str:
    """A short file's text, only if it is a regular file of this user's, opened without
    following a link."""
    try:
        return read_own(path, MAX_REQUEST)[0]
    except NotPrivate:
        raise ControlError(f"{path} is not a file of the run's user: not read") from None
    except PermissionError:
        raise ControlError(f"cannot read {path}: only the run's user may control it") from None
    except OSError as err:
        raise ControlError(f"cannot read {what} ({path}): {err.strerror}") from None


def _ended(log_dir: Path) -> str | None:
    events = RunDir(log_dir).events
    if not events.exists():
        return None
    for line in reversed(events.read_text().splitlines()):
        try:
            kind = json.loads(line).get("event")
        except ValueError:
            continue
        if kind in ("finished", "failed", "requeue"):
            return {"finished": "finished", "failed": "failed", "requeue": "been requeued"}[kind]
    return None
