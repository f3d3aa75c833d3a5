"""``sres ... --job J`` on a shared cluster: a job's user controls what its Comment says and what
its run dir holds; neither may get them another user's run, nor get root to read or send
anything the user could not.

Real Slurm: the attacker's job is a real job of the attacker's uid (root submits it with
``sbatch --uid``), read back through ``squeue --json``. The "supervisor" is a listener of the
test's on loopback, which records whatever reaches it: nothing must.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launcher.slurm.client import SlurmClient
from tests.support.users import User, opened_for_traverse

pytestmark = pytest.mark.cluster


class Listener:
    """A loopback port that records what arrives, as a control port would receive it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(65536))
                    conn.sendall(b'{"ok": true, "message": "forwarded"}\n')
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():
    one = Listener()
    yield one
    one.close()


@pytest.fixture
def slurm_for_users(cluster):
    """The test cluster's slurm.conf readable by the two users (it lives in root's pytest dir)."""
    changed = opened_for_traverse([cluster.conf_path])
    yield cluster
    for path, mode in reversed(changed):
        path.chmod(mode)


def job_of(cluster, user: User, comment: str) -> str:
    """A running job of ``user``'s (root submits it as them) with ``comment``."""
    client = SlurmClient.create("cli", env=cluster.env())
    job_id = client.submit(
        [
            f"--uid={user.name}",
            f"--gid={user.name}",
            f"--chdir={user.home}",
            "--output=/dev/null",
            f"--comment={comment}",
            "--wrap=sleep 300",
        ]
    )
    deadline = time.monotonic() + 30
    while not client.job(job_id).running:
        assert time.monotonic() < deadline, client.job(job_id)
        time.sleep(0.3)
    owner = client.job_owner(job_id)
    assert owner.user_id == user.uid, owner
    return job_id


def sres_as(user: User | None, cluster, *args: str):
    argv = [sys.executable, "-m", "launcher.cli", *args]
    if user is None:  # root
        import subprocess

        from tests.support.users import REPO

        env = {**cluster.env(), "PYTHONPATH": str(REPO)}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd="/")
    return user.run(argv, env=user.env(SLURM_CONF=str(cluster.conf_path)))


def plant_run_dir(
    user: User, name: str, port: int, token: str | None = None, link_to: str | None = None
) -> str:
    """A run dir as ``user`` makes it: control.json naming ``port``, a token file or a link."""
    code = textwrap.dedent(
        f"""
        import json, os
        d = os.path.join({str(user.home)!r}, {name!r})
        os.makedirs(d, mode=0o700, exist_ok=True)
        with open(os.path.join(d, "control.json"), "w") as f:
            json.dump({{"host": "127.0.0.1", "port": {port}, "pid": 1}}, f)
        t = os.path.join(d, "control.token")
        if {link_to!r}:
            os.symlink({link_to!r}, t)
        else:
            fd = os.open(t, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, {token!r}.encode())
            os.close(fd)
        print(d)
        """
    )
    done = user.python(code)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_comment_that_spells_another_owner_changes_nothing(slurm_for_users, users, listener):
    """The attacker's job says ``UserId=victim(...)`` in its Comment after the victim's run dir:
    the victim is refused (the job is not theirs, whatever the Comment spells). A job of the
    attacker's naming the victim's run dir plainly: root, who controls a job as its user, cannot
    read the victim's dir as the attacker. Nothing reaches the victim's control port."""
    cluster = slurm_for_users
    victim, attacker = users
    victim_run = plant_run_dir(victim, "run", listener.port, token="victims-token")
    spelled = job_of(cluster, attacker, f"sres-run={victim_run} UserId={victim.name}({victim.uid})")
    as_victim = sres_as(victim, cluster, "status", "--job", spelled)
    assert as_victim.returncode != 0
    assert f"belongs to {attacker.name}({attacker.uid})" in as_victim.stderr, as_victim.stderr

    plain = job_of(cluster, attacker, f"sres-run={victim_run}")
    as_root = sres_as(None, cluster, "status", "--job", plain)
    assert as_root.returncode != 0
    assert "only the run's user may control it" in as_root.stderr, as_root.stderr
    assert "Traceback" not in as_victim.stderr + as_root.stderr
    time.sleep(0.5)
    assert listener.received == []


def test_a_linked_token_is_not_read_and_nothing_goes_off_loopback(slurm_for_users, users, listener, tmp_path):
    """The attacker's own job names its own run dir, whose token is a link to a file only root
    may read, and whose address is the attacker's listener. Root's ``sres status --job`` reads
    nothing through the link and sends nothing."""
    cluster = slurm_for_users
    _, attacker = users
    secret = tmp_path / "root-only"
    secret.write_text("ROOT-ONLY-SECRET")
    secret.chmod(0o600)
    run_dir = plant_run_dir(attacker, "run", listener.port, link_to=str(secret))
    job = job_of(cluster, attacker, f"sres-run={run_dir}")

    as_root = sres_as(None, cluster, "status", "--job", job)
    assert as_root.returncode != 0
    assert "control.token" in as_root.stderr and "Traceback" not in as_root.stderr, as_root.stderr
    time.sleep(0.5)
    assert listener.received == []


PLANT_PACKAGE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path

    here, marker, victim_uid = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    for package in ("launcher", "launcher/cli"):
        (here / package).mkdir()
        (here / package / "__init__.py").write_text(
            f"import os\\nif os.getuid() == {victim_uid}: open({marker!r}, 'w').close()\\n"
        )
    """
)


def test_a_package_planted_where_the_user_stands_never_runs_in_the_jobs_step(
    slurm_for_users, users, tmp_path
):
    """``sres status --job J`` from a directory another user can write (a project's shared
    space): when the control port does not answer from here, the command runs again as a step
    of the job, which ran ``python -m launcher.cli`` in that directory, so the attacker's
    ``launcher/`` came first on the path and ran as the victim. The step now runs in ``/`` and
    without the working directory on its path."""
    cluster = slurm_for_users
    victim, attacker = users
    with socket.socket() as probe:  # a port no one listens on: the fallback step is taken
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    run = plant_run_dir(victim, "fallback", closed, token="victims-token")
    job = job_of(cluster, victim, f"sres-run={run}")  # the victim's own job
    shared = Path(tempfile.mkdtemp(prefix="sres-project-"))
    shared.chmod(0o777)
    marker = Path("/tmp") / f"sres-pwned-step-{victim.uid}"
    marker.unlink(missing_ok=True)
    try:
        planted = attacker.python(PLANT_PACKAGE, str(shared), str(marker), str(victim.uid))
        assert planted.returncode == 0, planted.stderr
        done = subprocess.run(
            [str(Path(sys.executable).parent / "sres"), "status", "--job", job],
            env=victim.env(SLURM_CONF=str(cluster.conf_path)),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=shared,
            user=victim.uid,
            group=victim.gid,
            extra_groups=[],
        )
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert not marker.exists(), "the planted package ran as the victim"
    assert "Traceback" not in done.stderr, done.stderr
    assert "does not answer" in done.stdout + done.stderr, (done.stdout, done.stderr)  # the step ran
