"""The epilog between a job's cut-off and its requeued start, under a real slurmd: what the
requeued job needs to restore from RAM stays.

A sharded (ZeRO-1) job is stopped whole while rank 1's copy of its newest step does not exist
yet (its files are removed while every process of the job is stopped, and then every process is
killed: the state a cut-off in the middle of that save leaves, made exactly rather than hoped for
by timing). Slurm requeues it;
the epilog runs on both nodes; the requeued job restores the newest step every rank has, one
older than rank 0's newest, and ends with the fault-free run's bits."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.support.sres_runs import freeze, sres_run, thaw
from tests.support.training_jobs import STEPS, sres_srun, submit_training

pytestmark = pytest.mark.cluster


def _complete(ram, host: str, sub: str, rank: int) -> set[int]:
    root = ram / f"node-{host}" / sub
    return {int(p.parent.parent.name[5:]) for p in root.glob(f"step-*/rank-{rank:05d}/manifest.json")}


def test_a_sharded_job_cut_off_mid_save_is_requeued_and_restores_the_common_step(hooked, tmp_path):
    reference = sres_run(tmp_path / "reference", nodes=2, steps=STEPS, train_args=("--sharded",))
    assert reference.returncode == 0, reference.stderr
    env = hooked.cluster.env()
    job = submit_training(
        hooked.cluster,
        tmp_path,
        ["-N2", "--requeue"],
        f"export SRES_RAM_ROOT={hooked.ram_root}; "
        + sres_srun(tmp_path / "run", "--auto-resume=1", "-N", "2"),
        train_args=("--sharded",),
    )
    job.wait_step(10)
    ram = hooked.ram_root / f"job-{job.job_id}"
    first, second = job.hosts()[:2]
    for _ in range(20):  # stopped where both ranks hold the same newest step and the one before
        freeze(str(tmp_path))  # the whole job, every thread stopped
        newest = max(_complete(ram, second, "own", 1))
        if {newest, newest - 1} <= _complete(ram, first, "own", 0):
            break
        thaw(str(tmp_path))  # CI: rank 0 held {9, 10} and rank 1 {8, 9}: no common step to restore
        time.sleep(0.2)
    else:
        raise AssertionError("rank 0 and rank 1 never held the same two newest steps")
    for host, sub in ((second, "own"), (first, "neighbour")):  # rank 1's save of `newest` never was
        for step in _complete(ram, host, sub, 1):
            if step >= newest:
                shutil.rmtree(ram / f"node-{host}" / sub / f"step-{step:08d}" / "rank-00001")
    common = newest - 1
    assert {newest, common} <= _complete(ram, first, "own", 0), (
        "rank 0 has the newest step and the one before"
    )
    assert common in _complete(ram, second, "own", 1)

    # Cut off where it stands: killed while stopped, no thread runs again. A requeue of the
    # stopped job sent SIGCONT first, and in CI a stopped copy of rank 1's newest step finished
    # its manifest before SIGTERM took effect: restored 10, not 9.
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
    job.wait(lambda j: j.finished, timeout=60)
    subprocess.run(["scontrol", "requeue", job.job_id], env=env, check=True, timeout=30)
    job.wait(lambda j: j.restart_count >= 1, timeout=60)
    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED", job.output
    epilogs = hooked.events(hook="epilog", job=job.job_id, event="cleanup")
    assert epilogs and all(e["status"] == "ok" for e in epilogs), epilogs
    restored = [e["step"] for e in job.of("restored")]
    assert restored == [common], f"restored {restored}, not step {common}: {job.output}"
    assert job.digests() == reference.digests(), job.output
