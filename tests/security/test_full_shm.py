"""Another user fills a node's ``/dev/shm`` (any user can): the health check must not drain the
node for it, or one user takes nodes from everyone; space root's own files hold still counts.

A small tmpfs (mode 1777, as ``/dev/shm`` is) stands for it; the attacker is a real other uid."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_plugins.checks.base import CheckContext, Status
from slurm_plugins.checks.system import check_shm
from slurm_plugins.health_config import ChecksConfig, HealthConfig, ShmConfig


@pytest.fixture
def shm():
    path = Path(tempfile.mkdtemp(prefix="sres-shm-", dir="/tmp"))  # where the attacker reaches it
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", str(path)])
    if mounted.returncode != 0:
        pytest.fail("cannot mount a tmpfs (tests run as root)", pytrace=False)
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)
    path.rmdir()


def _check(path, **shm) -> tuple[Status, str]:
    config = HealthConfig(checks=ChecksConfig(shm=ShmConfig(path=str(path), min_free_mib=8, **shm)))
    (result,) = check_shm(CheckContext(config, "n1"))
    return result.status, result.detail


def test_a_shm_another_user_filled_does_not_fail_the_check_but_roots_files_do(shm, attacker):
    fill = f"open({str(shm / 'junk')!r}, 'wb').write(b'x' * (12 << 20))"
    done = attacker.python(fill)
    assert done.returncode == 0, done.stderr
    status, detail = _check(shm)
    assert status is Status.OK and "in users' files, counted free" in detail, detail
    assert _check(shm, count_users_files=True)[0] is Status.FAIL  # an admin who wants it counted
    (shm / "junk").unlink()
    (shm / "roots").write_bytes(b"x" * (12 << 20))  # not a user's: the node's own problem
    assert _check(shm)[0] is Status.FAIL
