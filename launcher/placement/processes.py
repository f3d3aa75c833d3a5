"""Child processes of the supervisor, one per slot: what every placement starts its ranks with.

Each process runs in a session of its own (killing it kills what it started), dies with the
supervisor (a parent-death signal: an out-of-memory kill of the supervisor leaves no rank behind,
even one still importing torch, before its liveness connection exists), its output goes
to ``<log dir>/ranks/<slot>.log``, and the lines of the slot being echoed (the process that
holds rank 0) are also written to the console, so a user sees one training log. A placement
holds one of these and says what to run: the rank's command itself (``local``) or an ``srun``
step that runs it (``srun``). A fork server's output carries its children's lines and its replies
(:mod:`resilience.contract.fork_protocol`): each child's line goes to that child's log (and the
console when it is echoed), each reply to ``on_reply``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from resilience import parent_death
from resilience.contract import fork_protocol, slots
from resilience.contract.run_dir import RunDir
from launcher.errors import ConfigError

logger = logging.getLogger(__name__)


class Processes:
    def __init__(self, log_dir: Path, echo: TextIO | None) -> None:
        self.files = RunDir(Path(log_dir))
        self.files.ranks.mkdir(parents=True, exist_ok=True)
        self._echo = echo
        self.echo_slot: str | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self._echo_lock = threading.Lock()
        self.on_reply: Callable[[str, dict[str, object]], None] = lambda slot, message: None
        """Called from a reader thread with a fork server's slot and each reply it sends."""

    def start(self, slot: str, argv: Sequence[str], env: Mapping[str, str], feed: bool = False) -> int:
        """Start ``slot``'s process; ``feed``: its stdin is a pipe :meth:`send` writes to."""
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.PIPE if feed else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death.before_exec(os.getpid()) if main_thread else None,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as err:
            raise ConfigError(f"cannot start {argv[0]}: {err.strerror} (the training command)") from None
        self.procs[slot] = proc
        reader = threading.Thread(target=self._pump, args=(slot, proc), daemon=True, name=f"sres-out-{slot}")
        reader.start()
        self._readers.append(reader)
        return proc.pid

    def poll(self, slot: str) -> int | None:
        return self.procs[slot].poll()

    def send(self, slot: str, data: bytes) -> bool:
        """Write to a fed process's stdin; False when it cannot take it (it ended, or closed it)."""
        proc = self.procs.get(slot)
        if proc is None or proc.stdin is None or proc.poll() is not None:
            return False
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return False
        return True

    def close_input(self, slot: str) -> None:
        proc = self.procs.get(slot)
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def kill(self, slot: str) -> None:
        proc = self.procs[slot]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """Wait for processes to leave by themselves, then kill what is left."""
        for slot, proc in self.procs.items():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(slot)
                proc.wait()
            timeout_s = 1.0  # the first wait had the whole budget
        for reader in self._readers:
            reader.join(timeout=5)

    def _pump(self, slot: str, proc: subprocess.Popen[bytes]) -> None:
        out = proc.stdout
        assert out is not None, "started with stdout=PIPE"
        logs: dict[str, BinaryIO] = {slot: self.files.rank_log(slot).open("ab")}
        try:
            for line in iter(out.readline, b""):
                message = fork_protocol.decode_reply(line)  # None: a line of the process's own
                if message is None:
                    self._write(logs, slot, line)
                    continue
                if "out" in message or "forked" in message:  # a forked child has its log from its start
                    child = str(message.get("out", message.get("forked")))
                    text = str(message.get("line", "")).encode()
                    self._write(logs, child if slots.NAME.fullmatch(child) else slot, text)
                if "out" not in message:
                    try:
                        self.on_reply(slot, message)
                    except (KeyError, TypeError, ValueError) as err:  # a reply that does not parse
                        logger.warning("%s: reply %r refused: %s", slot, message, err)
        finally:
            out.close()
            for log in logs.values():
                log.close()

    def _write(self, logs: dict[str, BinaryIO], slot: str, line: bytes) -> None:
        """One line of ``slot``'s output to its log, and the console while it is echoed."""
        log = logs.get(slot)
        if log is None:
            log = logs[slot] = self.files.rank_log(slot).open("ab")
        log.write(line)
        log.flush()
        if slot == self.echo_slot and self._echo is not None:
            with self._echo_lock:
                self._echo.write(line.decode(errors="replace"))
                self._echo.flush()
