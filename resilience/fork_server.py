"""A node's fork server: the training script imported once, its ranks forked from it in milliseconds.

Every rank started on the recovery path (a respawn, a standby, a spare) would otherwise pay
Python, torch and the script's own imports again, and then first-use costs: seconds during which
the survivors wait. The supervisor starts one server per machine with the training command; the
script runs as usual up to ``resilience.run``, which, in this slot, calls :func:`serve` instead
of training. The server pays first-use costs once, then forks on request. The child returns from
:func:`serve` with its rank's environment and goes on in ``resilience.run`` exactly as a process
started cold: same code, same environment, its own session, its output in its slot's log.

What must hold for forking to be safe: the server holds no threads (a child would have none of
them, and a lock one of them held stays held), no CUDA context (CUDA cannot be used in a forked
child: it is initialized only in the child) and no connection a child would share. A script
that starts any of these before ``resilience.run`` gets one warning line; with CUDA initialized
the server refuses to serve and every rank starts cold. Children die with the server (their
output goes through it): its death is a fault of the ranks it forked, replaced as any other.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import selectors
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field

from resilience import parent_death
from resilience.contract import fork_protocol as proto

READ_BYTES = 1 << 16
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""What Slurm sends a step's tasks and a rank acts on (a preemption's ``--signal``, a lent node's
SIGTERM): the server passes them to its children rather than die of them, since its death
would be theirs. A tracker that signals every process of the step (``proctrack/linuxproc``,
cgroups) delivers them to the children as well: a rank's handlers only set a flag, so twice is
once."""
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Of those, the ones that end a process by default: the server forks nothing more and exits once
its children have (at once with none), as it would have died of them; waiting for KillWait's
SIGKILL instead held a released satellite's node for 30 s."""


EARLY: list[int] = []
"""Signals a forked rank got before it set its own handlers (:func:`early_signals`)."""


def _remember(signum: int, _frame: object) -> None:
    EARLY.append(signum)


def early_signals() -> list[int]:
    """The signals of :data:`RELAYED` that this forked rank received between its fork and now,
    oldest first; from now on they act as they did before the fork (the caller sets its own).
    Slurm's ``--signal`` reaches every process of a step: one that came before the rank set
    its preemption handler killed it (the default action), and the flush that preemption
    asks for then waited its whole minute for a rank that was gone."""
    got = list(EARLY)
    EARLY.clear()
    for signum in RELAYED:
        if signal.getsignal(signum) is _remember:
            signal.signal(signum, signal.SIG_DFL)
    return got


@dataclass
class _Child:
    slot: str
    pid: int
    out: int
    """The read end of the child's stdout and stderr."""
    partial: bytes = b""


@dataclass
class _Server:
    replies: int
    """The fd replies go to: the server's stdout as it was started (the supervisor reads it)."""
    selector: selectors.BaseSelector
    children: dict[int, _Child] = field(default_factory=dict)
    """pid -> child, until it is reaped."""
    requests: bytes = b""
    closed: bool = False
    """The supervisor closed the server's stdin: fork nothing more, leave when the children have."""
    handlers: dict[int, Any] = field(default_factory=dict)
    """The handlers :data:`RELAYED` had before the server relayed them: a child's again."""

    def relay(self, signum: int, _frame: object) -> None:
        if signum in ENDING:
            self.closed = True  # the step is ending (scancel, the job's end): leave with the children
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass  # exited, not reaped yet

    def send(self, message: dict[str, object]) -> None:
        data = proto.reply(message)
        while data:
            data = data[os.write(self.replies, data) :]


def unsafe_to_fork() -> list[str]:
    """What the script started before ``resilience.run`` that a forked child would not have or
    would share (threads, sockets)."""
    found = []
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        found.append(f"thread(s) {', '.join(sorted(others)[:5])}")
    sockets = _open_sockets()
    if sockets:
        found.append(f"{sockets} open socket(s)")
    return found


def _open_sockets() -> int:
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    count = 0
    for fd in fds:
        if fd in ("0", "1", "2"):  # the server's own channel (under srun, the step's I/O)
            continue
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_started() -> bool:
    """Whether this process started CUDA: torch's own lazy init, or only the driver's ``cuInit``
    (``torch.cuda.is_available()`` without ``PYTORCH_NVML_BASED_CUDA_CHECK``, which leaves
    ``torch.cuda.is_initialized()`` False). Either way a forked child cannot use the GPU.
    The driver is asked only where this process has already loaded it (``cuCtxGetCurrent``
    starts nothing: before ``cuInit`` it answers CUDA_ERROR_NOT_INITIALIZED)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    try:
        with open("/proc/self/maps") as maps:
            if not any("libcuda.so" in line for line in maps):
                return False
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    context = ctypes.c_void_p()
    return int(driver.cuCtxGetCurrent(ctypes.byref(context))) != CUDA_ERROR_NOT_INITIALIZED


def _refuse_if_cuda_started(when: str) -> None:
    if cuda_started():
        print(
            f"sres: warning: CUDA was started {when}: ranks cannot be forked (CUDA does not "
            "survive a fork); every rank of this node starts cold",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(3)


def serve(warm_up: Callable[[], None] | None = None) -> None:
    """Serve forks until the supervisor closes stdin, then exit; return only in a forked child,
    whose environment then is its rank's. ``warm_up``: a callable paying first-use costs."""
    t0 = time.monotonic()
    _refuse_if_cuda_started("before resilience.run")
    unsafe = unsafe_to_fork()
    if unsafe:
        print(
            f"sres: warning: the script started {' and '.join(unsafe)} before resilience.run: forked "
            f"ranks will not have them (start them inside train)",
            file=sys.stderr,
            flush=True,
        )
    if warm_up is not None:
        warm_up()
        _refuse_if_cuda_started("by the warm-up")  # ours to fix, but never a broken rank
    gc.collect()
    gc.freeze()  # what the children share stays shared: the collector never touches it
    server = _Server(os.dup(1), selectors.DefaultSelector())
    server.handlers = {sig: signal.signal(sig, server.relay) for sig in RELAYED}
    os.set_blocking(0, False)
    server.selector.register(0, selectors.EVENT_READ, None)
    server.send({"ready": round(time.monotonic() - t0, 3)})
    while not (server.closed and not server.children):
        for key, _ in server.selector.select(timeout=0.05):
            if key.data is None:
                env = _read_requests(server)
                if env is not None:
                    return
            else:
                _pump(server, key.data)
        _reap(server)
    raise SystemExit(0)  # the run is over: the server never trains


def _read_requests(server: _Server) -> dict[str, str] | None:
    """Handle what arrived on stdin; in a forked child, its environment (it returns to train)."""
    try:
        data = os.read(0, READ_BYTES)
    except BlockingIOError:
        return None
    if not data:
        server.closed = True
        server.selector.unregister(0)
        return None
    server.requests += data
    *lines, server.requests = server.requests.split(b"\n")
    for line in lines:
        try:
            request = json.loads(line)
        except ValueError:
            continue  # only the supervisor writes here; a broken line is skipped, never fatal
        if not isinstance(request, dict):
            continue
        if "kill" in request:
            _kill(server, str(request["kill"]))
        elif "fork" in request and not server.closed:
            env = {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}
            if _fork(server, str(request["fork"]), env):
                return env
    return None


def _fork(server: _Server, slot: str, env: dict[str, str]) -> bool:
    """Fork ``slot``'s process; True in the child."""
    try:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except OSError as err:
        server.send({"refused": slot, "why": f"{type(err).__name__}: {err}"})
        return False
    if pid == 0:
        _become_child(server, write, read, env)
        return True
    os.close(write)
    os.set_blocking(read, False)
    child = _Child(slot, pid, read)
    server.children[pid] = child
    server.selector.register(read, selectors.EVENT_READ, child)
    server.send({"forked": slot, "pid": pid})
    return False


def _become_child(server: _Server, write: int, read: int, env: dict[str, str]) -> None:
    """Now a rank process as one started cold would be: its own session, dead with the server,
    its output on its own pipe, no stdin, nothing of the server's channel, its rank's environment."""
    os.setsid()
    parent_death.ask(signal.SIGKILL)
    for signum, handler in server.handlers.items():  # ending ones as before; the rest kept for it
        signal.signal(signum, handler if signum in ENDING else _remember)
    os.close(read)
    for child in server.children.values():
        if child.out >= 0:  # a child whose pipe ended, not reaped yet, has none
            os.close(child.out)
    server.selector.close()
    os.close(server.replies)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_blocking(0, True)
    os.dup2(write, 1)
    os.dup2(write, 2)
    os.close(write)
    os.environ.clear()
    os.environ.update(env)  # what the server imported stays frozen: shared pages stay shared


def _pump(server: _Server, child: _Child) -> bool:
    """Relay what the child's pipe holds now; False when it holds nothing more now (or ever)."""
    try:
        data = os.read(child.out, READ_BYTES)
    except BlockingIOError:
        return False
    if not data:
        _pump_eof(server, child)
        return False
    _lines(server, child, data)
    return True


def _lines(server: _Server, child: _Child, data: bytes) -> None:
    *lines, child.partial = (child.partial + data).split(b"\n")
    for line in lines:
        server.send({"out": child.slot, "line": line.decode(errors="replace") + "\n"})


def _pump_eof(server: _Server, child: _Child) -> None:
    server.selector.unregister(child.out)
    os.close(child.out)
    child.out = -1
    if child.partial:
        server.send({"out": child.slot, "line": child.partial.decode(errors="replace")})


def _reap(server: _Server) -> None:
    while server.children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = server.children.pop(pid, None)
        if child is None:
            continue
        try:  # what the rank started in its own group (its data loader's workers) dies with it
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # none left
        _drain(server, child)  # what it printed last comes before its exit
        server.send({"exit": child.slot, "code": _returncode(status)})


def _drain(server: _Server, child: _Child) -> None:
    """Read what is left in a dead child's pipe without waiting (a process it started may still
    hold the pipe open: its later lines come when they come)."""
    while child.out >= 0 and _pump(server, child):
        pass


def _kill(server: _Server, slot: str) -> None:
    for child in server.children.values():
        if child.slot == slot:
            for kill in (os.killpg, os.kill):  # its group, and itself if it had no session yet
                try:
                    kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
