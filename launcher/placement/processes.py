"""Child processes of the supervisor, one per slot: what every placement starts its ranks with.

Each process runs in a session of its own (killing it kills what it started), dies with the
supervisor (a parent-death signal: an out-of-memory kill of the supervisor leaves no rank behind,
even one still importing torch, before its liveness connection exists), its output goes
to ``<log dir>/ranks/<slot>.log``, and the lines of the slot being echoed (the process that
holds rank 0) are also written to the console, so a user sees one training log. A placement
holds one of these and says what to run: the rank's command itself (``local``) or an ``srun``
step that runs it (``srun``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from resilience import parent_death
from launcher.errors import ConfigError


class Processes:
    def __init__(self, log_dir: Path, echo: TextIO | None) -> None:
        self.log_dir = Path(log_dir) / "ranks"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._echo = echo
        self.echo_slot: str | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self._echo_lock = threading.Lock()

    def start(self, slot: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
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
        with (self.log_dir / f"{slot}.log").open("ab") as log:
            for line in iter(out.readline, b""):
                log.write(line)
                log.flush()
                if slot == self.echo_slot and self._echo is not None:
                    with self._echo_lock:
                        self._echo.write(line.decode(errors="replace"))
                        self._echo.flush()
        out.close()
