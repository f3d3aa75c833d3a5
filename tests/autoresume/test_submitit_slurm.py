"""submitit on the real local Slurm cluster (accounting disabled): ``ResilientExecutor`` jobs
survive a real node death, preemption and cancellation, and report results and failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

from launcher.slurm.client import SlurmClient
from launcher.submitit import ResilientExecutor
from launcher.submitit_job import run_dir
from resilience.examples.submit_mlp import train
from tests.support.slurm_cluster import wait_processes_gone
from tests.support.submitit_jobs import always_raises, record_places, wait_event
from tests.support.training_jobs import wait_job

pytestmark = pytest.mark.cluster

STEPS = 40


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> str:
    """Rank 0's digest of the same job run locally: placement does not change the math."""
    ex = ResilientExecutor(folder=tmp_path_factory.mktemp("submitit-local") / "%j", cluster="local")
    ex.update_parameters(nodes=3, timeout_min=10, no_tiers=True)
    return ex.submit(train, STEPS).result()


def executor(tmp_path, **parameters) -> ResilientExecutor:
    """30 minutes: a signal counts as the time limit's in the last 10 (submitit's rule), so a
    scancel --signal=USR2 here is a preemption."""
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(**{"nodes": 3, "spares": 1, "timeout_min": 30, "hang_timeout": 5, **parameters})
    return ex


def final_state(job, timeout: float = 60.0) -> str:
    """The job's state once Slurm has ended it (it ends when the function returns, not at its time limit)."""
    deadline = time.monotonic() + timeout
    while (state := job.watcher.get_state(job.job_id, mode="force")) in ("RUNNING", "COMPLETING", "PENDING"):
        assert time.monotonic() < deadline, f"job {job.job_id} still {state} {timeout:.0f} s after its result"
        time.sleep(0.5)
    return state


def test_a_real_node_death_gives_the_fault_free_result(slurm_env, tmp_path, fault_free):
    job = executor(tmp_path, no_tiers=True).submit(train, STEPS, 256, 0.25)
    start = wait_event(job, "generation")
    time.sleep(2.0)
    hosts = next(e for e in job.events() if e["event"] == "start")["hosts"]
    slurm_env.kill_node(hosts[1])
    assert job.result() == fault_free
    assert final_state(job) == "COMPLETED"  # from slurmctld: the cluster has no accounting
    fault = next(e for e in job.events() if e["event"] == "fault")
    replaced = next(e for e in job.events() if e["event"] == "replaced")
    assert (fault["kind"], fault["host"]) == ("node", hosts[1]) and replaced["how"] == "spare"
    assert start["generation"] == 1


def test_preemption_requeues_and_resumes(slurm_env, tmp_path, fault_free):
    job = executor(tmp_path, persistent_dir=str(tmp_path / "ckpt"), persist_every=3).submit(
        train, STEPS, 256, 0.25
    )
    wait_event(job, "checkpoint-saved")  # training is under way (a signal during a rank's start kills it)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    assert job.result() == fault_free
    client = SlurmClient.create("cli", env=slurm_env.env())
    assert wait_job(client, job.job_id, lambda j: j.finished).restart_count == 1
    requeue = [e for e in job.events() if e["event"] == "requeue"]
    restored = [e for e in job.events() if e["event"] == "restored"]
    flushes = [e for e in job.events() if e["event"] in ("flushed", "flush-failed")]
    assert requeue and requeue[0]["saved_step"] is not None, flushes
    assert restored and restored[-1]["step"] >= requeue[0]["saved_step"] >= 0  # nothing saved is lost
    assert requeue[0]["cause"] == "preemption"


def test_a_function_that_always_raises_fails_once(slurm_env, tmp_path):
    job = executor(tmp_path, max_restarts=1, no_tiers=True).submit(always_raises, "raised on every entry")
    with pytest.raises(submitit.core.utils.FailedJobError, match="ValueError: raised on every entry"):
        job.result()
    assert final_state(job) == "FAILED"
    assert not [e for e in job.events() if e["event"] == "requeue"]


def test_cancel_leaves_nothing_running(slurm_env, tmp_path):
    job = executor(tmp_path, no_tiers=True).submit(train, 10_000, 256, 0.05)
    wait_event(job, "generation")
    job.cancel()
    wait_processes_gone(run_dir(job.paths.folder, job.job_id))
    assert final_state(job) in ("CANCELLED", "GONE") and os.environ["SLURM_CONF"]


@pytest.mark.parametrize("max_num_timeout", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_tiny_time_limit_requeues_max_num_timeout_times_then_fails_clearly(
    slurm_env, tmp_path, max_num_timeout
):
    """timeout_min=3: Slurm signals the job (B:USR2@120) at its first time-limit check after 60 s,
    each run (slurmctld checks every 30 s, so 90-120 s before the limit: room for a loaded
    machine to stop the ranks). Not 2: the signal is then due at once, and a check that falls
    in the first tenth of a second of a run kills the batch shell's python before it catches
    USR2 (seen in CI: the requeued run ended WTERMSIG 12, 0.06 s after it started). The first
    signal near the limit requeues (a time-limit requeue, from the saved step); the second finds
    max_num_timeout=1 used and fails the job with that reason, without waiting for Slurm. CI runs
    max_num_timeout=0 (one time-limit wait, the job fails at the first signal); ``-m slow`` the
    requeue too."""
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm", max_num_timeout=max_num_timeout)
    ex.update_parameters(
        nodes=2, timeout_min=3, hang_timeout=5, persistent_dir=str(tmp_path / "ckpt"), persist_every=3
    )
    job = ex.submit(train, 100_000, 256, 0.05)
    with pytest.raises(
        submitit.core.utils.FailedJobError,
        match=rf"already requeued {max_num_timeout} time\(s\) at its time limit "
        rf"\(--max-timeout-requeues {max_num_timeout}\)",
    ):
        job.result()
    requeues = [e for e in job.events() if e["event"] == "requeue"]
    assert [(e["cause"], e["restart_count"]) for e in requeues] == [("time-limit", 0)][:max_num_timeout]
    client = SlurmClient.create("cli", env=slurm_env.env())
    done = wait_job(client, job.job_id, lambda j: j.finished)
    assert (done.state, done.restart_count) == ("FAILED", max_num_timeout)


def test_an_array_task_is_preempted_requeued_as_itself_and_resumes(slurm_env, tmp_path, fault_free):
    """map_array: each task is a resilient job of its own (ids <array>_<task>, results, events);
    USR2 to one task requeues that task alone, which resumes from its saved step."""
    ex = executor(tmp_path, spares=0, persistent_dir=str(tmp_path / "ckpt"), persist_every=3)
    jobs = ex.map_array(train, [STEPS, STEPS], [256, 256], [0.25, 0.25])
    assert [j.job_id.split("_")[1] for j in jobs] == ["0", "1"] and all(
        isinstance(j, type(jobs[0])) for j in jobs
    )
    wait_event(jobs[1], "checkpoint-saved", timeout=180)
    subprocess.run(["scancel", "--signal=USR2", jobs[1].job_id], check=True)
    assert [j.result() for j in jobs] == [fault_free, fault_free]
    requeues = [[e["cause"] for e in j.events() if e["event"] == "requeue"] for j in jobs]
    assert requeues == [[], ["preemption"]]
    client = SlurmClient.create("cli", env=slurm_env.env())
    assert [wait_job(client, j.job_id, lambda s: s.finished).restart_count for j in jobs] == [0, 1]


def test_a_node_without_scontrol_fails_the_job_with_one_clear_line(slurm_env, tmp_path):
    """The supervisor asks slurmctld through scontrol; a compute node without it (PATH here)
    fails the job at once, and job.exception() says what is missing and where."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("srun", "sbatch", "squeue", "scancel"):
        (bare / tool).symlink_to(shutil.which(tool))
    ex = executor(tmp_path, no_tiers=True)
    ex.update_parameters(slurm_setup=[f"export PATH={bare}:{Path(sys.executable).parent}"])
    job = ex.submit(train, STEPS)
    with pytest.raises(
        submitit.core.utils.FailedJobError, match=r"sres on \S+: 'scontrol' not found on PATH"
    ):
        job.result()
    assert final_state(job) == "FAILED"


def test_each_rank_of_a_two_node_job_reads_its_own_place_from_submitit(slurm_env, tmp_path):
    """Each rank is an srun step of its own (SLURM_PROCID 0 of 1 there): what the function reads of
    submitit's JobEnvironment, TorchDistributedEnvironment and RANK/WORLD_SIZE is its rank of 2."""
    out = tmp_path / "places"
    out.mkdir()
    job = executor(tmp_path, nodes=2, spares=0, no_tiers=True).submit(record_places, str(out), 4)
    assert job.results() == [0, 1]  # each rank's value, as submitit's task of its number
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}.json").read_text()) == {
            "job": [rank, 0, 2, rank, 2],
            "torch_distributed_environment": [rank, 2, 0],
            "torch": [rank, 2, 0],
            "ctx": [rank, 2],
        }
