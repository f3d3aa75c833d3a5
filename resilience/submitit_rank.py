"""One rank of a job submitted with ``launcher.submitit.ResilientExecutor``.

``python -m resilience.submitit_rank SUBMITTED_PICKLE RESULT_PICKLE``, started by the sres
supervisor like any training command: it loads the submitted call (submitit's pickle of
``train, *args``), runs ``train(ctx, *args)`` under :func:`resilience.run`, so that it is
re-entered after every fault, and the process that is rank 0 when training ends writes the
return value where submitit's ``job.result()`` reads it. A failure is written by the job's
entry point (``launcher.submitit_job``), which sees the whole run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from submitit.core import utils

import resilience


def run_submitted(submitted: Path, result: Path) -> None:
    delayed = utils.DelayedSubmission.load(submitted)
    outcome: dict[str, Any] = {}

    def train(ctx: resilience.Context) -> None:
        value = delayed.function(ctx, *delayed.args, **delayed.kwargs)
        outcome.update(rank=ctx.rank, value=value)

    resilience.run(train)
    if outcome.get("rank") == 0:
        with utils.temporary_save_path(result) as tmp:
            utils.cloudpickle_dump(("success", outcome["value"]), tmp)


if __name__ == "__main__":
    run_submitted(Path(sys.argv[1]), Path(sys.argv[2]))
