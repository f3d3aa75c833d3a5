"""A victim's real runs and an attacker of another uid (tests.support.users).

The victim runs ``sres run`` with the tiers on two simulated nodes, under its default RAM root
(``/dev/shm/sres-<uid>``) and a log dir in its home: what a user of a shared node does.
"""

from __future__ import annotations

import glob
import shutil
from pathlib import Path

import pytest

from tests.support.sres_runs import Run, sres_command
from tests.support.users import User, two_users

STEPS = 14
JOB = "victim"


@pytest.fixture(scope="session")
def users(tmp_path_factory) -> tuple[User, User]:
    with two_users(tmp_path_factory.mktemp("users")) as pair:
        yield pair


@pytest.fixture
def victim(users) -> User:
    return users[0]


@pytest.fixture
def attacker(users) -> User:
    return users[1]


def ram_roots(user: User) -> list[str]:
    return glob.glob(f"/dev/shm/sres-{user.uid}*")


@pytest.fixture
def no_ram_roots(users):
    """The test starts with no RAM root of the victim's and no payload marker, and leaves none.
    Only the local lane's tests use it: the Slurm lane's run beside them, as the same users."""
    clean(users[0])
    yield
    clean(users[0])


def clean(victim: User) -> None:
    for path in map(Path, ram_roots(victim)):
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)
    marker(victim).unlink(missing_ok=True)


def victim_run(
    victim: User,
    *args: str,
    name: str,
    train_args: tuple[str, ...] = (),
    persistent: Path | None = None,
    open_files: int | None = None,
    again: bool = False,
) -> Run:
    """``sres run`` as the victim: 2 nodes, RAM and neighbour tiers, a persistent dir of its own
    (or ``persistent``, kept as it is). ``name``: the log dir's, one per test (a watcher started
    before the run must not read an earlier test's events). ``open_files``: the soft limit the
    victim's shell starts it with (a login's is often 1,024). ``again``: a second run in the
    same log dir (its kept secret), as a requeued job or a rerun makes."""
    log_dir = victim.home / name
    if not again:
        shutil.rmtree(log_dir, ignore_errors=True)  # a run of its own: nothing of an earlier test's
    if persistent is None:
        persistent = victim.home / f"{name}.persistent"
        shutil.rmtree(persistent, ignore_errors=True)
    tier_args = ("--job-id", JOB, "--persistent-dir", str(persistent), "--persist-every", "4")
    cmd = sres_command(
        log_dir, 2, (*tier_args, *args), "resilience.examples.train_mlp", STEPS, train_args, 5, 30
    )
    if open_files is not None:
        cmd = ["sh", "-c", f'ulimit -Sn {open_files} && exec "$@"', "sh", *cmd]
    proc = victim.run(cmd, timeout=240)
    return Run(proc.returncode, proc.stdout, proc.stderr, log_dir)


@pytest.fixture(scope="session")
def victim_reference(users) -> dict[int, str]:
    """The final digests of the victim's fault-free run, no attacker around."""
    run = victim_run(users[0], name="reference")
    assert run.returncode == 0, run.stderr
    digests = run.digests()
    assert len(digests) == 2 and len(set(digests.values())) == 1
    return digests


def marker(victim: User) -> Path:
    """What the attacker's payload creates if it ever runs (as whoever unpickles it)."""
    return Path("/tmp") / f"sres-pwned-{victim.uid}"
