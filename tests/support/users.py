"""Two real, unprivileged users on this machine: a victim who runs training and an attacker.

The attacks of ``tests/security`` are made by a real process of another uid, with nothing but
what any user of a shared node has: the ports (``/proc/net/tcp``), the job ids, ``/dev/shm``,
``/tmp``. Creating users needs root; CI runs as root.

Python and the repository must be reachable by both users: a directory on their path that
others cannot traverse (``/root`` is 0700 where pyenv lives there) is given ``o+x`` (traverse
only, no listing) for the session and restored afterwards.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NAMES = ("sres-victim", "sres-attacker")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A login-like environment: no SRES_*, SLURM_* or root's HOME."""
        keep = ("PATH", "LANG", "LC_ALL", "TZ")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(HOME=str(self.home), USER=self.name, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        env.update(extra)
        return env

    def _as_me(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "cwd": str(self.home)}

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv),
            env=dict(env or self.env()),
            capture_output=True,
            text=True,
            timeout=timeout,
            **self._as_me(),
        )

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            list(argv),
            env=dict(env or self.env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **self._as_me(),
        )

    def python(self, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``python -c code args...`` as this user."""
        return self.run([sys.executable, "-c", code, *args], timeout=timeout)


def _ensure_user(name: str, base: Path) -> User:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    home = base / name
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700, parents=True)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return User(name, entry.pw_uid, entry.pw_gid, home)


def opened_for_traverse(paths: Sequence[Path]) -> list[tuple[Path, int]]:
    """Give ``o+x`` to each ancestor of ``paths`` that lacks it; the (dir, old mode) changed."""
    changed = []
    for path in paths:
        for parent in reversed(Path(path).resolve().parents):
            mode = stat.S_IMODE(os.stat(parent).st_mode)
            if not mode & stat.S_IXOTH:
                os.chmod(parent, mode | stat.S_IXOTH)
                changed.append((parent, mode))
    return changed


@contextmanager
def two_users(base: Path) -> Iterator[tuple[User, User]]:
    """(victim, attacker), with homes under ``base`` (which both may traverse)."""
    if os.geteuid() != 0:
        raise PermissionError("the security tests create two users: run them as root (CI does)")
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o711)
    changed = opened_for_traverse([Path(sys.executable), REPO, base])
    try:
        yield _ensure_user(NAMES[0], base), _ensure_user(NAMES[1], base)
    finally:
        for path, mode in reversed(changed):
            os.chmod(path, mode)
