"""One rank of a job submitted with ``launcher.submitit.ResilientExecutor``.

``python -m resilience.submitit_rank SUBMITTED_PICKLE RESULT_PICKLE``, started by the sres
supervisor like any training command: it loads the submitted call (submitit's pickle) and runs it
under :func:`resilience.run`, so that it is re-entered after every fault. The function gets the
training context where it asks for it (:mod:`resilience.submitted_call`) and is otherwise called
as itself. Before a requeue (time limit, preemption) rank 0 checkpoints a ``Checkpointable``
callable as submitit does (:func:`checkpoint`). Each rank is submitit's task of its rank number,
in every generation: ``JobEnvironment`` says so, its output goes to that task's log files, and
when training ends it writes its return value where ``job.task(k).result()`` reads it
(RESULT_PICKLE, task 0's, serves when submitit cannot tell its environment). A failure is
written by the job's entry point (``launcher.submitit_job``), which sees the whole run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import submitit
from submitit.core import utils

import resilience
from resilience import submitted_call
from resilience.rank_place import submitit_variables


def run_submitted(submitted: Path, result: Path) -> None:
    delayed = utils.DelayedSubmission.load(submitted)
    outcome: dict[str, Any] = {}

    def before_requeue(cause: str) -> None:
        if outcome.get("rank") == 0:  # as submitit's: rank 0 alone checkpoints, the others return
            checkpoint(delayed, submitted)

    def train(ctx: resilience.Context) -> None:
        outcome.update(rank=ctx.rank, task=_be_task(ctx))
        ctx.on_requeue(before_requeue)
        args, kwargs = submitted_call.arguments(delayed.function, delayed.args, delayed.kwargs, ctx)
        outcome.update(value=delayed.function(*args, **kwargs))

    resilience.run(train)
    task: utils.JobPaths | None = outcome.get("task")
    if "value" in outcome and (task is not None or outcome.get("rank") == 0):
        _write_result(task.result_pickle if task is not None else result, outcome["value"])


def checkpoint(delayed: utils.DelayedSubmission, submitted: Path) -> None:
    """submitit's checkpoint before a requeue: the callable's ``__submitit_checkpoint__`` (else
    ``checkpoint``, as ``submitit.helpers.Checkpointable`` defines it) gives the call the job
    runs again, written over the job's pickle; a callable without one, or one that returns None,
    is run again as submitted. The job's time-limit count is sres's (``max_num_timeout``)."""
    again = delayed._checkpoint_function()
    if again is None:
        return
    again.set_timeout(delayed._timeout_min, delayed._timeout_countdown)
    with utils.temporary_save_path(submitted) as tmp:
        again.dump(tmp)


def _write_result(result: Path, value: Any) -> None:
    """Where ``job.result()`` reads it; a value that cannot be pickled is the job's error, named."""
    try:
        data = cloudpickle.dumps(("success", value))
    except Exception as err:  # noqa: BLE001 - whatever pickling raised is what the user must see
        data = cloudpickle.dumps(
            ("error", f"the function returned a value that cannot be pickled: {type(err).__name__}: {err}")
        )
    with utils.temporary_save_path(result) as tmp:
        tmp.write_bytes(data)


def _be_task(ctx: resilience.Context) -> utils.JobPaths | None:
    """Make this process submitit's task ``ctx.rank`` for this generation: what ``JobEnvironment``
    reads (its local or Slurm spelling), and its stdout and stderr going to that task's log files,
    where ``job.stdout()`` and ``job.task(k)`` read them. The task's paths; None when submitit
    cannot tell which environment this is (nothing to keep true then)."""
    try:
        env = submitit.JobEnvironment()
    except RuntimeError:
        return None
    os.environ.update(submitit_variables(ctx.place, type(env)._env))
    paths = env.paths  # read from the variables just set: this rank's task
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in ((1, paths.stdout), (2, paths.stderr)):
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, fd)
        os.close(log)
    return paths


if __name__ == "__main__":
    run_submitted(Path(sys.argv[1]), Path(sys.argv[2]))
