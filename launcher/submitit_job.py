"""The job's own process under ``ResilientExecutor``: the sres supervisor, then the outcome for submitit.

``python -u -m launcher.submitit_job FOLDER -- SUBCOMMAND [sres options]`` is the command
submitit runs (once per job: on the batch host under Slurm, as the single task of the local
controller otherwise). It runs ``sres run`` / ``sres srun`` with each rank executing
``resilience.submitit_rank``; rank 0 writes the return value. When the run fails, this process
writes the failure where ``job.exception()`` reads it: the first failing rank's traceback and
sres's one-line reason. A run that requeued itself writes nothing: the job runs again.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

if __name__ == "__main__":  # before the imports below (torch): Slurm may signal a requeue at once
    from launcher.run import signal_latch

    signal_latch.latch(sys.argv[4:])

import submitit  # noqa: E402
from submitit.core import utils  # noqa: E402

from launcher import cli  # noqa: E402
from launcher.errors import SresError  # noqa: E402
from launcher.observability.events import read_events  # noqa: E402

RUN_DIR = "{job_id}_sres"
"""The run's log dir (events.jsonl, rank logs) in the submitit folder."""


def run_dir(folder: Path, job_id: str) -> Path:
    return Path(folder) / RUN_DIR.format(job_id=job_id)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m launcher.submitit_job FOLDER -- run|srun [sres options]", file=sys.stderr)
        return 2
    subcommand, options = argv[2], argv[3:]
    os.environ["SUBMITIT_FOLDER"] = argv[0]  # as submitit's own process_job: JobEnvironment reads it
    env = submitit.JobEnvironment()
    paths = env.paths
    log_dir = run_dir(paths.folder, env.job_id)
    rank = [
        sys.executable,
        "-u",
        "-m",
        "resilience.submitit_rank",
        str(paths.submitted_pickle),
        str(paths.result_pickle),
    ]
    error = None
    try:
        code = cli.run([subcommand, "--log-dir", str(log_dir), *options, *rank])
    except SresError as err:  # e.g. no scontrol on this node: the one line is what job.exception() shows
        print(f"sres: error: {err}", file=sys.stderr)
        code, error = 1, f"sres on {socket.gethostname()}: {err}"
    if not paths.result_pickle.exists() and not _requeued(log_dir):
        with utils.temporary_save_path(paths.result_pickle) as tmp:
            utils.cloudpickle_dump(("error", error or failure_text(log_dir, code)), tmp)
    return code


def failure_text(log_dir: Path, code: int) -> str:
    """What ``job.exception()`` shows: the first failing rank's traceback, then sres's reason."""
    events = read_events(log_dir / "events.jsonl") if (log_dir / "events.jsonl").exists() else []
    failed = next((e for e in reversed(events) if e["event"] == "failed"), None)
    if failed is None:
        return f"sres ended with exit code {code} before training ended (see {log_dir} and the job's log)"
    trace = failed.get("traceback") or ""
    return f"{trace}\nsres: {failed['reason']}" if trace else f"sres: {failed['reason']}"


def _requeued(log_dir: Path) -> bool:
    path = log_dir / "events.jsonl"
    events = read_events(path) if path.exists() else []
    return bool(events) and events[-1]["event"] == "requeue"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
