"""One rank of a job submitted with ``launcher.submitit.ResilientExecutor``.

``python -m resilience.submitit_rank SUBMITTED_PICKLE RESULT_PICKLE``, started by the sres
supervisor like any training command: it loads the submitted call (submitit's pickle), runs it
under :func:`resilience.run`, so that it is re-entered after every fault, and the process that is
rank 0 when training ends writes the return value where submitit's ``job.result()`` reads it.
The function gets the training context where it asks for it (:mod:`resilience.submitted_call`)
and is otherwise called as itself; either way submitit's ``JobEnvironment`` says this rank's
place, in every generation. A failure is written by the job's entry point
(``launcher.submitit_job``), which sees the whole run.
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

    def train(ctx: resilience.Context) -> None:
        _tell_submitit(ctx)
        args, kwargs = submitted_call.arguments(delayed.function, delayed.args, delayed.kwargs, ctx)
        value = delayed.function(*args, **kwargs)
        outcome.update(rank=ctx.rank, value=value)

    resilience.run(train)
    if outcome.get("rank") == 0:
        _write_result(result, outcome["value"])


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


def _tell_submitit(ctx: resilience.Context) -> None:
    """Set what submitit's ``JobEnvironment`` reads (local or Slurm spelling) to this generation's place."""
    try:
        names = type(submitit.JobEnvironment())._env
    except RuntimeError:  # submitit cannot tell which environment this is: nothing to keep true
        return
    os.environ.update(submitit_variables(ctx.place, names))


if __name__ == "__main__":
    run_submitted(Path(sys.argv[1]), Path(sys.argv[2]))
