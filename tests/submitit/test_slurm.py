"""The parts of submitit's own ``submitit/slurm/test_slurm.py`` (submitit 1.5.4) that test a job
rather than submitit's text handling, on the real test cluster: ``ResilientExecutor(folder,
cluster="slurm")`` in place of ``SlurmExecutor``, and a real job where submitit mocks sbatch and
runs ``process_job`` itself. What submitit asserts of the job is asserted unchanged.

Ported: ``test_slurm_job_mocked``, ``test_slurm_job_array_mocked``, ``test_slurm_error_mocked``,
``test_requeuing_checkpointable`` (a real preemption, ``scancel --signal=USR2``, in place of
calling the signal handler under a fast-forwarded clock) and ``test_slurm_weird_dir``; the arrays
and two of the folder names are in the slow tier (``-m slow``), CI's time. The rest
test submitit's own code, which ResilientExecutor runs unchanged: sbatch strings, parsing
squeue/sacct output and node lists, parameter checks, and mocks of its requeue call.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from submitit.core import test_core, utils
from submitit.slurm import slurm

from launcher.submitit import ResilientExecutor
from tests.support.submitit_jobs import Resumable

pytestmark = pytest.mark.cluster


def test_slurm_job(slurm_env, tmp_path: Path) -> None:
    executor = ResilientExecutor(folder=tmp_path, cluster="slurm")
    job = executor.submit(test_core.do_nothing, 1, 2, blublu=3)
    assert job.state in ("PENDING", "RUNNING")
    assert job.result() == 12
    stdout, stderr = job.stdout(), job.stderr()
    assert stdout is not None and "my kwargs {'blublu': 3}" in stdout
    assert stderr is not None


@pytest.mark.slow  # 40 s each in CI; a Slurm array runs there in test_submitit_slurm's array test
@pytest.mark.parametrize("use_batch_api", (False, True))
def test_slurm_job_array(slurm_env, use_batch_api: bool, tmp_path: Path) -> None:
    n = 5
    executor = ResilientExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(slurm_array_parallelism=3)
    data1, data2 = range(n), range(10, 10 + n)

    def add(x: int, y: int) -> int:
        assert x in data1
        assert y in data2
        return x + y

    jobs = []
    if use_batch_api:
        with executor.batch():
            for d1, d2 in zip(data1, data2):
                jobs.append(executor.submit(add, d1, d2))
    else:
        jobs = executor.map_array(add, data1, data2)
    array_id = jobs[0].job_id.split("_")[0]
    assert [f"{array_id}_{a}" for a in range(n)] == [j.job_id for j in jobs]
    assert list(map(add, data1, data2)) == [j.result() for j in jobs]
    sbatch = utils.JobPaths(tmp_path, job_id=array_id).submission_file.read_text()
    array_line = [line.strip() for line in sbatch.splitlines() if "--array" in line]
    assert array_line == ["#SBATCH --array=0-4%3"]


def test_slurm_error(slurm_env, tmp_path: Path) -> None:
    executor = ResilientExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(slurm_time=24, gpus_per_node=0)  # just to cover the function
    job = executor.submit(test_core.do_nothing, 1, 2, error=12)
    with pytest.raises(utils.FailedJobError):
        job.result()
    exception = job.exception()
    assert isinstance(exception, utils.FailedJobError)
    assert "ValueError: Too bad" in exception.args[0]


def test_requeuing_checkpointable(slurm_env, tmp_path: Path) -> None:
    """submitit's: a preempted Checkpointable is checkpointed and requeued, its countdown of
    timeouts untouched; here on two real nodes, with rank 0 taking the checkpoint."""
    executor = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm", max_num_timeout=1)
    executor.update_parameters(nodes=2, timeout_min=30, hang_timeout=5)
    job = executor.submit(Resumable(), str(tmp_path))
    for rank in (0, 1):
        deadline = time.monotonic() + 120
        while not (tmp_path / f"started{rank}").exists():
            assert time.monotonic() < deadline, f"rank {rank} never started: {job.events()}"
            time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    assert job.result() == "resumed from the checkpoint"
    assert (tmp_path / "checkpoint").read_text() == "0\n"
    submission = utils.DelayedSubmission.load(job.paths.submitted_pickle)
    assert submission.kwargs == {"resumed": True} and submission._timeout_countdown == 1
    (requeue,) = [e for e in job.events() if e["event"] == "requeue"]
    assert requeue["cause"] == "preemption"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a_0", marks=pytest.mark.slow),
        "a 0",
        pytest.param('a"=0"', marks=pytest.mark.slow),
        "a'; echo foo",
    ],
)
def test_slurm_weird_dir(slurm_env, tmp_path: Path, name: str) -> None:
    """submitit's weird_tmp_path names, but those with a backslash (``a\\=0``) or a newline (which
    submitit's test skips too): a backslash in ``--output`` stops sbatch's ``%j`` expansion
    (sbatch(1)), and the job (submitit's own script text, which ours is) ends FAILED with no log
    under Slurm 22.05; submitit's test passes only under its mock of sbatch."""
    executor = ResilientExecutor(folder=tmp_path / name, cluster="slurm")
    job = executor.submit(test_core.do_nothing, 1, 2, blublu=3)
    assert job.result() == 12
    assert isinstance(job, slurm.SlurmJob)
    assert job.paths.stdout.exists() and job.paths.stderr.exists()
