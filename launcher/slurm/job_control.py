"""``sres grow|shrink|resize|status --job J``: a Slurm job id instead of the run's log dir.

The supervisor records its log dir in the job's ``Comment`` (``sres-run=<dir>``), which
``scontrol show job`` shows to whoever may see the job. Only the job's user or root may
control it; the refusal is one line, before anything is sent. The owner and the Comment are
read from Slurm's typed records (:meth:`SlurmClient.job_owner`), never from text in which a
Comment could spell ``UserId=``; what is then read in the run dir is read as the job's user
(:func:`launcher.supervisor.control.send`). Where the supervisor's
control port (loopback, on the job's batch host) cannot be reached from here, the request
goes as a step of the job itself (``srun --jobid=J --overlap`` on the batch host): Slurm then
checks the user too.
"""

from __future__ import annotations

import logging
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path

from launcher.errors import ConfigError, ControlError, SlurmCommandError, SlurmError, Unreachable
from launcher.slurm.client import SlurmClient
from launcher.slurm.types import JobOwner
from resilience.own_python import own_module

log = logging.getLogger(__name__)

COMMENT_PREFIX = "sres-run="


def register(client: SlurmClient, job_id: str, log_dir: Path) -> None:
    """Name the run's log dir in the job's Comment, unless the user gave the job one."""
    try:
        comment = client.job_owner(job_id).comment
        if comment in ("", "(null)") or comment.startswith(COMMENT_PREFIX):
            client.set_comment(job_id, f"{COMMENT_PREFIX}{Path(log_dir).resolve()}")
        else:
            log.warning(
                "job %s has a comment of its own: sres ... --job %s will not find the run", job_id, job_id
            )
    except SlurmError as err:
        log.warning(
            "could not record the run in job %s's comment (%s): use its log dir to control it", job_id, err
        )


def run_dir(client: SlurmClient, job_id: str, uid: int | None = None) -> tuple[Path, JobOwner]:
    """The run's log dir of job ``job_id`` and the job's record, after checking that this user
    may control it. The dir is only what the job's Comment says: it is read as the job's user,
    and must be that user's (:func:`launcher.supervisor.control.send`)."""
    try:
        job = client.job_owner(job_id)
    except SlurmError as err:
        raise ConfigError(f"job {job_id}: {err}") from None
    uid = os.getuid() if uid is None else uid
    if uid != 0 and job.user_id != uid:
        raise ConfigError(
            f"job {job_id} belongs to {_user(job.user_id)}; only its user or root may control it "
            f"(you are {_user(uid)})"
        )
    if not job.running:
        raise ConfigError(f"job {job_id} is {job.state}: nothing to control")
    comment = job.comment
    if not comment.startswith(COMMENT_PREFIX):
        raise ConfigError(
            f"job {job_id} runs no sres supervisor that says where it is (its Comment names no "
            f"{COMMENT_PREFIX}...): give the run's log dir instead"
        )
    return Path(comment.removeprefix(COMMENT_PREFIX)), job


def send(client: SlurmClient, job_id: str, argv: list[str], here: Callable[[str, int], int]) -> int:
    """Deliver ``sres <argv[0]> <run dir> <argv[1:]>`` to the job's supervisor: ``here`` (the
    command itself, given the run dir) when its control port answers from this host, else the
    same command as a step of the job on its batch host."""
    log_dir, job = run_dir(client, job_id)
    try:
        return here(str(log_dir), job.user_id)
    except Unreachable:
        pass
    command = [argv[0], str(log_dir), *argv[1:]]
    try:
        sys.stdout.write(client.run_step(job_id, job.batch_host, own_module("launcher.cli", *command)))
    except SlurmCommandError as err:  # the step's own one-line error, not srun's "exit code 1" after it
        said = [line for line in err.stderr.splitlines() if line.startswith("sres: error: ")]
        if not said:
            raise
        why = said[-1].removeprefix("sres: error: ")
        raise ControlError(f"{why} (asked as a step of the job on {job.batch_host})") from None
    return 0


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name}({uid})"
    except KeyError:
        return str(uid)
