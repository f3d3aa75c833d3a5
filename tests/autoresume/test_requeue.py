"""Last resort and preemption: the job requeues itself and resumes from its saved state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.slurm_cluster import processes_with_env
from tests.support.training_jobs import REPO, STEPS, sres_srun, submit_training

pytestmark = pytest.mark.cluster

PERSIST_EVERY = 3


def test_no_spare_and_no_idle_node_requeues_and_resumes_from_saved_state(cluster, tmp_path, reference3):
    client_env = cluster.env()
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"],
        env=client_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    job = submit_training(
        cluster,
        tmp_path,
        ["-N3", "--no-kill", "--requeue", "--exclusive"],
        sres_srun(
            tmp_path / "run",
            "--auto-resume=1",
            "-N",
            "3",
            "--persistent-dir",
            str(tmp_path / "ckpt"),
            "--persist-every",
            str(PERSIST_EVERY),
        ),
    )
    job.wait_step(10)
    # Each host's RAM tier is keyed by its Slurm name, so a requeue that hands the job some of
    # the same hosts (in any order) finds their copies.
    ram = Path(os.environ["SRES_RAM_ROOT"]) / f"job-{job.job_id}"
    assert {p.name for p in ram.glob("node-*")} == {f"node-{h}" for h in job.hosts()}
    victim = job.hosts()[1]
    cluster.kill_node(victim)
    requeued = job.wait(lambda j: j.restart_count >= 1, timeout=60)
    assert requeued.restart_count == 1
    (fault,) = job.of("fault")
    assert job.of("requeue"), job.output
    assert "no spare node is left, nor an idle node to grow into" in job.of("requeue")[0]["why"]
    subprocess.run(["scancel", blocker], env=client_env, check=True)  # nodes are back

    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED", job.output
    assert job.digests() == reference3, job.output
    second = job.of("start")[-1]
    assert second["restart_count"] == 1 and victim not in second["hosts"]
    (restored,) = job.of("restored")  # from the survivors' RAM tiers, or the persistent tier
    assert fault["step"] - 1 - restored["step"] <= PERSIST_EVERY, (
        job.events
    )  # steps lost <= the save interval
    assert job.of("finished")[-1]["steps"] == STEPS


def test_preemption_signal_saves_requeues_and_resumes(cluster, tmp_path, reference3):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N3", "--no-kill", "--requeue"],
        sres_srun(
            tmp_path / "run",
            "--auto-resume=1",
            "-N",
            "3",
            "--persistent-dir",
            str(tmp_path / "ckpt"),
            "--persist-every",
            "1000",
        ),
    )
    job.wait_step(8)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], env=cluster.env(), check=True)
    requeued = job.wait(lambda j: j.restart_count >= 1, timeout=60)
    assert requeued.restart_count == 1
    (flushed,) = job.of("flushed")
    assert flushed["step"] >= 7 and "preempted" in job.of("requeue")[0]["why"]

    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED", job.output
    assert job.digests() == reference3, job.output
    (restored,) = job.of("restored")
    # The flushed step at least; the RAM tiers may hold a commit made after the flush.
    assert restored["step"] >= flushed["step"], job.events
    assert not job.of("fault")


def test_preemption_signal_from_the_environment_during_start_up_requeues(cluster, tmp_path, reference3):
    """Issue 28: ``SRES_PREEMPT_SIGNAL=TERM`` exported (no --preempt-signal, as under srun --auto-resume),
    TERM to the batch shell while sres still imports torch: the shell survives and the run requeues."""
    srun = sres_srun(tmp_path / "run", "--auto-resume=1", "-N", "3", module="launcher.entry")
    job = submit_training(
        cluster, tmp_path, ["-N3", "--no-kill", "--requeue"], f"export SRES_PREEMPT_SIGNAL=TERM\nexec {srun}"
    )  # sres is the batch shell
    _wait_latched(job.job_id)
    assert not job.of("start"), "the supervisor was up before the signal: not a start-up signal"
    subprocess.run(["scancel", "--batch", "--signal=TERM", job.job_id], env=cluster.env(), check=True)
    requeued = job.wait(lambda j: j.restart_count >= 1 or j.finished, timeout=120)
    assert requeued.restart_count == 1, f"not requeued: {requeued.state}\n{job.output}"
    assert "preempted (SIGTERM, during start-up)" in job.of("requeue")[0]["why"], job.events

    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED", job.output
    assert job.of("start")[-1]["restart_count"] == 1
    assert job.of("finished")[-1]["steps"] == STEPS
    assert job.digests() == reference3, job.output


def _wait_latched(job_id: str, timeout: float = 60.0) -> None:
    """Until the job's sres process has run the signal latch (it catches TERM or USR2, which a
    Python process does not by default) but not long after: torch's import follows."""
    mask = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGUSR2 - 1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in processes_with_env(f"SLURM_JOB_ID={job_id}"):
            try:
                if b"launcher.entry" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            caught = next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1]
            if int(caught, 16) & mask:
                return
        time.sleep(0.01)
    raise AssertionError(f"job {job_id}: no sres process latched a signal within {timeout:.0f} s")


def test_preemption_when_requeues_are_used_up_fails_clearly(tmp_path):
    """SLURM_RESTART_COUNT at --max-requeues: the supervisor says so instead of requeueing again."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_")) or k == "SRES_RAM_ROOT"
    }  # the session's private RAM tier
    env["SLURM_RESTART_COUNT"] = "2"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.entry",
            "run",
            "--nodes",
            "2",
            "--max-requeues",
            "2",
            "--log-dir",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            "-m",
            "resilience.examples.train_mlp",
            "--steps",
            "400",
            "--sleep-s",
            "0.05",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "run" / "events.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "error: preempted (SIGUSR2); the job was already requeued 2 time(s) (--max-requeues 2)" in err
