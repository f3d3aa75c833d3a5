"""Runs of ``sres run`` to their end: real processes, real gloo, real SIGKILLs; nothing left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.observability.events import read_events
from resilience.process_name import name_of, names
from tests.support.slurm_cluster import pid_alive, processes_with_env

STEPS = 14


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    log_dir: Path

    @property
    def events(self) -> list[dict]:
        return read_events(self.log_dir / "events.jsonl")

    def digests(self) -> dict[int, str]:
        return {rank: data["digest"] for rank, data in self.results().items()}

    def results(self) -> dict[int, dict]:
        """Each rank's ``rank<R>.json`` (:mod:`resilience.examples.outputs`), by rank."""
        out = {}
        for path in sorted((self.log_dir / "out").glob("rank*.json")):
            data = json.loads(path.read_text())
            out[data["rank"]] = data
        return out

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def rank_logs(self, tail: int = 1500) -> str:
        """The end of each rank process's log: what an assertion on faults shows when it fails."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}"
            for path in sorted((self.log_dir / "ranks").glob("*.log"))
        )


def sres_command(
    log_dir: Path,
    nodes: int,
    args: tuple[str, ...],
    module: str,
    steps: int,
    train_args: tuple[str, ...],
    hang_timeout: float = 8,
    reform_timeout: float = 20,
    python: str = sys.executable,
) -> list[str]:
    """``sres run`` of ``python -m module`` with the tests' short timeouts, writing its results
    to ``log_dir/out``; ``python``: the ranks' interpreter (a framework's own environment).

    ``hang_timeout`` 8 s: a rank's lease is 3/4 of it (6 s), less a beat, room for a loaded 2-core
    machine. (The 5.0 s start-up stall that made it 8 was a store connection made after the hello,
    waiting on a silent nameserver: fixed, ``tests/network/test_slow_nameserver.py``.) Tests of
    detection pass their own (``tests/network``: 4 s)."""
    return [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        str(nodes),
        "--log-dir",
        str(log_dir),
        "--hang-timeout",
        str(hang_timeout),
        "--reform-timeout",
        str(reform_timeout),
        *args,
        "--",
        python,
        "-m",
        module,
        "--steps",
        str(steps),
        "--out",
        str(log_dir / "out"),
        *train_args,
    ]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a run's SRES_* and Slurm's SLURM_* (the session's private RAM
    root kept), plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_")) or k == "SRES_RAM_ROOT"
    }
    env.update(extra)
    return env


def sres_run(
    tmp: Path,
    *args: str,
    train_args: tuple[str, ...] = (),
    nodes: int = 4,
    timeout: float = 240,
    steps: int = STEPS,
    example: str = "train_mlp",
) -> Run:
    log_dir = tmp / "run"
    cmd = sres_command(log_dir, nodes, args, f"resilience.examples.{example}", steps, train_args)
    return run_command(cmd, clean_env(), log_dir, timeout)


def run_command(cmd: list[str], env: dict[str, str], log_dir: Path, timeout: float) -> Run:
    """Run ``sres run`` to its end and check that none of its processes is left behind."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    leftover = [p for p in processes_with_env(f"SRES_LOG_DIR={log_dir.resolve()}") if pid_alive(p)]
    assert not leftover, f"processes of the run still alive: {leftover}"
    return Run(proc.returncode, proc.stdout, proc.stderr, log_dir)


def sres(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, timeout=60
    )


def when_event(log_dir: Path, predicate, then, timeout_s: float = 180) -> threading.Thread:
    """Run ``then()`` on a thread once an event of the run matches ``predicate``."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        path = log_dir / "events.jsonl"
        while time.monotonic() < deadline:
            if path.exists() and any(predicate(e) for e in read_events(path)):
                then()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def freeze(pattern: str, timeout_s: float = 10.0) -> None:
    """SIGSTOP every process whose command line holds ``pattern``, and return once each of their
    threads is stopped. ``kill`` returns at once, and a thread inside a system call finishes it
    first: on a loaded CI machine a tier copy's last rename landed after the test had listed the
    copies it then removed, and the requeued job restored a step the test meant to be incomplete."""
    subprocess.run(["pkill", "-STOP", "-f", pattern], check=True)
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            while (state := _state(task)) not in ("T", "t", "Z", "X", None):
                assert time.monotonic() < deadline, f"thread {task.name} of {pid} is still {state}"
                time.sleep(0.01)


def thaw(pattern: str) -> None:
    """SIGCONT what :func:`freeze` stopped."""
    subprocess.run(["pkill", "-CONT", "-f", pattern], check=True)


def _state(task: Path) -> str | None:
    """A thread's scheduler state (``/proc/PID/task/TID/stat``'s third field), None once gone."""
    try:
        return task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def slot_of(pid: int) -> str | None:
    """The slot of one of the run's processes: its environment's ``SRES_SLOT``, except for a rank
    forked from a fork server, whose environment is its server's (``n<node>f``: a fork execs
    nothing) and whose name says its slot (:mod:`resilience.process_name`). A cold process still
    importing has not named itself yet; its environment is its own from the start."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    slot = next((e[len(b"SRES_SLOT=") :].decode() for e in environ if e.startswith(b"SRES_SLOT=")), None)
    if slot is not None and re.fullmatch(r"n\d+f", slot):  # a fork server, or a rank it forked
        return name_of(pid)
    return slot


def slot_pids(log_dir: Path, slot: str, wait_s: float = 10.0) -> set[int]:
    """The run's live processes of ``slot`` (a rank, a standby, a fork server), wherever they run
    on this machine (a Slurm test cluster's nodes are this machine too). Waits up to ``wait_s``
    for one that is still starting."""
    deadline = time.monotonic() + wait_s
    while True:
        ours = processes_with_env(f"SRES_LOG_DIR={Path(log_dir).resolve()}")
        pids = {pid for pid in ours if slot_of(pid) in (slot, names(slot))}
        if pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def kill_slot(log_dir: Path, slot: str) -> None:
    """SIGKILL the run's process of ``slot``."""
    pids = slot_pids(log_dir, slot)
    assert pids, f"no process of slot {slot}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
