"""Processes on this machine, read from /proc: what a run must not leave behind."""

from __future__ import annotations

from pathlib import Path


def processes_with_env(entry: str) -> list[int]:
    """PIDs of processes whose environment holds ``entry`` (``KEY=value``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def pid_alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie (which runs no code and holds no port)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
