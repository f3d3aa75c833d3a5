"""Functions the submitit tests submit: importable by the job's own process, which unpickles
them by module and name; and what those tests wait for on a job."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import submitit
import submitit.helpers

import resilience


def always_raises(ctx, message: str) -> None:
    raise ValueError(message)


def add(a: int, b: int) -> int:
    return a + b


def record_places(out_dir: str, steps: int, ctx: resilience.Context) -> int:
    """Commit ``steps`` empty steps, then write what submitit and torch say of this rank's place
    (``rank<k>.json``, k as submitit says it): read after any re-formation, as user code would.
    Returns k, task k's result."""
    for _ in ctx.steps(steps):
        with ctx.commit():
            time.sleep(0.05)
    job = submitit.JobEnvironment()
    dist_env = submitit.helpers.TorchDistributedEnvironment()
    seen = {
        "job": [job.global_rank, job.local_rank, job.num_tasks, job.node, job.num_nodes],
        "torch_distributed_environment": [dist_env.rank, dist_env.world_size, dist_env.local_rank],
        "torch": [int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")],
        "ctx": [ctx.rank, ctx.world_size],
    }
    Path(out_dir, f"rank{job.global_rank}.json").write_text(json.dumps(seen))
    return job.global_rank


def count_calls_and_raise(calls: str, fail_times: int) -> str:
    """Append a line to ``calls`` per call; raise on the first ``fail_times`` calls."""
    with open(calls, "a") as out:
        out.write("call\n")
    if len(Path(calls).read_text().splitlines()) <= fail_times:
        raise ValueError("the same error every time")
    return "ok"


class Resumable(submitit.helpers.Checkpointable):
    """Writes ``started`` then waits a minute, until a checkpoint (``checkpoint``: where it was
    taken: ``RANK``, absent outside a rank) makes the call that runs again return at once."""

    def __call__(self, out_dir: str, resumed: bool = False) -> str:
        if resumed:
            return "resumed from the checkpoint"
        Path(out_dir, f"started{os.environ['RANK']}").write_text("")
        time.sleep(60)
        return "ran to its end"

    def __submitit_checkpoint__(
        self, out_dir: str, resumed: bool = False
    ) -> submitit.helpers.DelayedSubmission:
        with open(Path(out_dir, "checkpoint"), "a") as out:
            out.write(os.environ.get("RANK", "none") + "\n")
        return submitit.helpers.DelayedSubmission(self, out_dir, resumed=True)


def train_noting_requeues(ctx: resilience.Context, out_dir: str, steps: int, sleep_s: float) -> str:
    """The example MLP, whose ranks write the requeue's cause (``requeue<rank>``) when one comes."""
    from resilience.examples.submit_mlp import train

    ctx.on_requeue(lambda cause: Path(out_dir, f"requeue{ctx.rank}").write_text(cause))
    return train(ctx, steps, 256, sleep_s)


def a_lock() -> threading.Lock:
    return threading.Lock()  # cannot be pickled


def wait_event(job, kind: str, timeout: float = 90.0) -> dict:
    """The newest ``kind`` event of ``job``'s run, once there is one."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in job.events() if e["event"] == kind]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no {kind} event after {timeout:.0f} s: {job.events()}"
        time.sleep(0.2)


def job_process(job) -> int:
    """The pid of a local job's own process (the supervisor): the one child of submitit's
    controller, ``job._process``."""
    pid = job._process.pid
    (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)
