"""The job's own process under ``ResilientExecutor``: the sres supervisor, then the outcome for submitit.

``python -u -m launcher.submitit_job FOLDER --request JSON`` is the command submitit runs
(once per job: on the batch host under Slurm, as the single task of the local controller
otherwise; :func:`command_line` writes it). JSON is the ``RunRequest`` the executor made; this
process completes it (every rank runs ``resilience.submitit_rank`` on this job's pickles, the
log dir is ``<folder>/<job id>_sres``) and runs it with ``supervise``; the ranks write the return
values (each rank its own, as submitit's task of that number). When the run fails, this process
writes the failure where ``job.exception()`` reads it, for every task: the rank's own traceback
(else the lowest failing rank's) and sres's one-line reason. A run that requeued itself writes
nothing (the job runs again, with the same command line), nor does a cancelled one.

Jobs submitted before requests existed run ``FOLDER -- run|srun [sres options]``: that form
still works (through the CLI's parser).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any
from pathlib import Path

STARTED = time.monotonic()
"""When this run began: a local job's time limit counts from its start (submitit's controller's)."""
REQUEST = "--request"

if __name__ == "__main__":  # before the imports below (torch): Slurm may signal a requeue at once
    from launcher.run import signal_latch

    if sys.argv[2:3] == [REQUEST]:
        signal_latch.latch_request(sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        signal_latch.latch(sys.argv[4:])

import submitit  # noqa: E402
from submitit.core import logger, utils  # noqa: E402
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # noqa: E402

from resilience import parent_death  # noqa: E402
from launcher.errors import SresError  # noqa: E402
from launcher.observability.events import INTERRUPTED, read_events  # noqa: E402
from launcher.observability.timeline import Timeline, timeline  # noqa: E402
from launcher.placement.local import LocalRerun  # noqa: E402
from launcher.run.request import RunRequest  # noqa: E402
from resilience.contract.run_dir import RunDir  # noqa: E402
from resilience.submitit_rank import checkpoint  # noqa: E402

RUN_DIR = "{job_id}_sres"
"""The run's log dir (events.jsonl, rank logs) in the submitit folder."""
USAGE = "usage: python -m launcher.submitit_job FOLDER --request JSON (or FOLDER -- run|srun [sres options])"


def run_dir(folder: Path, job_id: str) -> Path:
    return Path(folder) / RUN_DIR.format(job_id=job_id)


def command_line(python: str, folder: Path | str, request: RunRequest) -> list[str]:
    """The command that runs ``request`` as a job in ``folder`` (submitit's, with ``%j``)."""
    return [python, "-u", "-m", "launcher.submitit_job", str(folder), REQUEST, request.to_json()]


def main(argv: list[str]) -> int:
    if not (len(argv) == 3 and argv[1] == REQUEST) and not (len(argv) >= 3 and argv[1] == "--"):
        print(USAGE, file=sys.stderr)
        return 2
    os.environ["SUBMITIT_FOLDER"] = argv[0]  # as submitit's own process_job: JobEnvironment reads it
    # A cancel (the controller's SIGINT) and the controller's death (the signal asked below) stop the
    # run only if SIGINT raises here: a process started in the background of a script inherits it
    # ignored (seen: every job of such a shell outlived its cancel and its killed controller).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parent_death.ask(signal.SIGINT)  # a killed controller (job._process) stops the run as a cancel does
    env = submitit.JobEnvironment()
    paths = env.paths
    log_dir = run_dir(paths.folder, env.job_id)
    rank = (
        sys.executable,
        "-u",
        "-m",
        "resilience.submitit_rank",
        str(paths.submitted_pickle),
        str(paths.result_pickle),
    )
    error = None
    submitted = paths.submitted_pickle.stat().st_mtime_ns
    earlier = _events(log_dir)  # the job's earlier runs (requeued): this run's events follow them
    try:
        code = _run(argv[1:], rank, log_dir, _local_rerun(earlier))
    except SresError as err:  # e.g. no scontrol on this node: the one line is what job.exception() shows
        print(f"sres: error: {err}", file=sys.stderr)
        code, error = 1, f"sres on {socket.gethostname()}: {err}"
    events = _events(log_dir)
    end = events[len(earlier) :].last("requeue", "failed", "finished")
    requeued = end is not None and end.is_("requeue")
    if requeued:  # the job runs again: nothing to write
        if paths.submitted_pickle.stat().st_mtime_ns == submitted:  # rank 0's hook did not checkpoint
            _checkpoint_as_submitted(paths.submitted_pickle)
        logger.get_logger().info(f"Requeued job {env.job_id} ({_timeouts_left(argv, events)})")
    elif end is not None and end.is_("failed"):
        logger.get_logger().error(f"sres: {end['reason']}")  # submitit's own job lines: stdout and stderr
    if requeued or (end is not None and end.get("reason") == INTERRUPTED):
        return code  # as under submitit's executors: no outcome, job.exception() is UncompletedJobError
    for task in range(_tasks(argv)):  # each rank wrote its own value when the run finished
        result = utils.JobPaths(argv[0], env.job_id, task_id=task).result_pickle
        if not result.exists():
            failure = (error or failure_text(events, log_dir, code, task)) if code != 0 else None
            missing = f"sres: the run ended without a rank {task} (a smaller world at its end; see {log_dir})"
            with utils.temporary_save_path(result) as tmp:
                utils.cloudpickle_dump(("error", failure or missing), tmp)
    return code


def _checkpoint_as_submitted(submitted: Path) -> None:
    """The checkpoint of the callable as submitted, when rank 0 could not take its own (the
    requeue came before it ran the function, or it was lost): what it did since is lost as in
    a restart, but a ``Checkpointable`` still gets to say what runs again."""
    try:
        checkpoint(utils.DelayedSubmission.load(submitted), submitted)
    except Exception as err:  # noqa: BLE001 - the user's code: said, and the job runs again as submitted
        logger.get_logger().warning(
            f"sres: the checkpoint before the requeue failed: {type(err).__name__}: {err}"
        )


def _events(log_dir: Path) -> Timeline:
    path = RunDir(log_dir).events
    return read_events(path) if path.exists() else Timeline()


def _local_rerun(events: Sequence[dict[str, Any]]) -> LocalRerun | None:
    """Under submitit's local controller, which runs this process again when it exits with
    LOCAL_REQUEUE_RETURN_CODE and signals it ``signal_delay_s`` before ``timeout_min``: this run's
    requeue and time limit. None elsewhere (Slurm's are Slurm's). The log dir is the job's, so
    its ``requeue`` events count the runs before this one."""
    if "SUBMITIT_LOCAL_JOB_ID" not in os.environ:
        return None
    limit = os.environ.get("SUBMITIT_LOCAL_TIMEOUT_S")
    requeues = timeline(events).count("requeue")
    return LocalRerun(LOCAL_REQUEUE_RETURN_CODE, float(limit) if limit else None, STARTED, requeues)


def _timeouts_left(argv: list[str], events: Sequence[dict[str, Any]]) -> str:
    """submitit's "N remaining timeouts": the time-limit requeues still allowed."""
    cap = RunRequest.from_json(argv[2]).options.max_timeout_requeues if argv[1] == REQUEST else None
    if cap is None:
        return "no limit on timeouts"
    used = sum(1 for e in timeline(events).of("requeue") if e.get("cause") == "time-limit")
    return f"{cap - used} remaining timeouts"


def _tasks(argv: list[str]) -> int:
    """The job's submitit tasks: its ranks (one for a job of the form before requests)."""
    if argv[1] != REQUEST:
        return 1
    request = RunRequest.from_json(argv[2])
    return request.nodes * request.procs_per_node


def _run(args: list[str], rank: tuple[str, ...], log_dir: Path, rerun: LocalRerun | None) -> int:
    """The request completed with this job's rank command and log dir, supervised; the exit code."""
    if args[0] != REQUEST:  # a job submitted before requests: its sres command line
        from launcher import cli

        return cli.run([args[1], "--log-dir", str(log_dir), *args[2:], *rank])
    from launcher.run.supervise import supervise

    request = RunRequest.from_json(args[1])
    persistent = _own_persistent_dir(request.options.persistent_dir, os.environ)
    options = dataclasses.replace(request.options, log_dir=log_dir, persistent_dir=persistent)
    logging.basicConfig(level=logging.WARNING, format="sres: %(message)s")  # as sres without -v
    logger.get_logger().propagate = False  # submitit's job lines have handlers of their own
    return supervise(dataclasses.replace(request, command=rank, options=options), rerun=rerun)


def _own_persistent_dir(persistent_dir: str | None, environ: Mapping[str, str]) -> str | None:
    """An array task's persistent checkpoints in a directory of its own, ``<dir>/task-<i>``: each
    task is a job of its own (``<array>_<i>``), and tasks sharing one directory overwrote each
    other's manifests at the same steps (a run is refused a directory with another job's)."""
    task = environ.get("SLURM_ARRAY_TASK_ID")
    return str(Path(persistent_dir) / f"task-{task}") if persistent_dir and task else persistent_dir


def failure_text(events: Sequence[dict[str, Any]], log_dir: Path, code: int, task: int = 0) -> str:
    """What ``job.task(task).exception()`` shows: that rank's own error if it raised one, else
    the lowest failing rank's (submitit's ``job.exception()`` is the lowest failing task's), else
    the error that ended the run; then sres's reason."""
    failed = timeline(events).last("failed")
    if failed is None:
        return f"sres ended with exit code {code} before training ended (see {log_dir} and the job's log)"
    own: dict[str, str] = failed.get("errors") or {}
    lowest = min(own, key=int, default=None)
    trace = own.get(str(task)) or (own[lowest] if lowest is not None else failed.get("traceback") or "")
    return f"{trace}\nsres: {failed['reason']}" if trace else f"sres: {failed['reason']}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
