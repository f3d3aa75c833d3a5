"""submitit from Python on this machine: ``ResilientExecutor(cluster="local")`` runs the same job
as ``sres run`` (simulated nodes, real processes, gloo, real SIGKILLs) behind submitit's API."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import submitit

from launcher.submitit import ResilientExecutor
from launcher.submitit_job import run_dir
from resilience.examples.submit_mlp import train
from tests.support.slurm_cluster import wait_processes_gone
from tests.support.submitit_jobs import (
    a_lock,
    add,
    always_raises,
    count_calls_and_raise,
    Resumable,
    job_process,
    record_places,
    train_noting_requeues,
    wait_event,
)

STEPS = 20


def executor(tmp_path, max_num_timeout: int = 3, **parameters) -> ResilientExecutor:
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local", max_num_timeout=max_num_timeout)
    defaults = dict(nodes=3, spares=1, timeout_min=10, no_tiers=True, hang_timeout=3)
    ex.update_parameters(**{**defaults, **parameters})
    return ex


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> str:
    job = executor(tmp_path_factory.mktemp("submitit-reference")).submit(train, STEPS)
    return job.result()


def test_a_node_killed_mid_run_gives_the_fault_free_result(tmp_path, fault_free):
    job = executor(tmp_path, inject=["node:1:step=8"]).submit(train, STEPS)
    assert job.result() == fault_free  # rank 0's final state digest, bitwise
    kinds = [e["event"] for e in job.events()]
    assert "fault" in kinds and "recovered" in kinds and kinds[-1] == "finished"
    (fault,) = [e for e in job.events() if e["event"] == "fault"]
    assert (fault["kind"], fault["node"]) == ("node", 1)
    assert job.state == "FINISHED" and job.done()


def test_a_function_that_always_raises_fails_once_with_its_traceback(tmp_path):
    job = executor(tmp_path, max_restarts=1).submit(always_raises, "the user's own error")
    with pytest.raises(submitit.core.utils.FailedJobError) as err:
        job.result()
    text = str(err.value)
    assert "ValueError: the user's own error" in text and "in always_raises" in text  # the original traceback
    assert "sres: " in text  # and sres's one-line reason
    assert [e["event"] for e in job.events()].count("failed") == 1


def test_cancel_leaves_nothing_running(tmp_path):
    job = executor(tmp_path).submit(train, 10_000, 256, 0.05)
    wait_event(job, "generation", timeout=60)
    job.cancel()
    wait_processes_gone(run_dir(job.paths.folder, job.job_id))


def test_unknown_or_bad_parameters_are_refused_at_once(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    with pytest.raises(ValueError, match="unknown parameter 'hang_timout'"):
        ex.update_parameters(hang_timout=3)
    with pytest.raises(ValueError, match="spares=-1"):
        ex.update_parameters(spares=-1)
    with pytest.raises(ValueError, match="cluster='pbs'"):
        ResilientExecutor(folder=tmp_path, cluster="pbs")


def test_batch_and_map_array_give_resilient_jobs(tmp_path):
    """submitit's batch() builds DelayedJobs and turns them into our job class in place; the
    jobs of one batch or map_array each have their own result and events."""
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=1, timeout_min=10, no_tiers=True)
    with ex.batch():
        batched = [ex.submit(train, 4), ex.submit(train, 5)]
    mapped = ex.map_array(train, [4, 5])
    results = [job.result() for job in batched + mapped]
    assert results[:2] == results[2:] and results[0] != results[1]
    assert all(job.events()[-1]["event"] == "finished" for job in batched + mapped)


def test_a_plain_function_runs_as_itself(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=1, timeout_min=10, no_tiers=True)
    assert ex.submit(add, 1, 2).result() == 3


def test_every_rank_reads_its_true_place_from_submitit_and_torch_after_a_node_loss(tmp_path):
    """Node 1 is lost at step 3 and the spare node takes its rank: what that process reads of
    submitit's JobEnvironment, TorchDistributedEnvironment and RANK/WORLD_SIZE/LOCAL_RANK is
    rank 1 of 2, on node 1 of 2 (not the spare's slot, not rank 0 of 1)."""
    out = tmp_path / "places"
    out.mkdir()
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=2, spares=1, timeout_min=10, no_tiers=True, inject=["node:1:step=3"])
    job = ex.submit(record_places, str(out), 8)
    assert job.results() == [0, 1]  # each rank's value, as submitit's task of its number
    assert job.result() == 0  # the one change on purpose: rank 0's value, where submitit refuses
    assert [e["node"] for e in job.events() if e["event"] == "fault"] == [1]
    for rank in (0, 1):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen == {
            "job": [rank, 0, 2, rank, 2],
            "torch_distributed_environment": [rank, 2, 0],
            "torch": [rank, 2, 0],
            "ctx": [rank, 2],
        }


def test_the_same_error_every_time_runs_twice_and_a_one_off_shows_as_a_recovered_fault(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=1, timeout_min=10, no_tiers=True)  # max_restarts: the default, 3
    always, once = tmp_path / "always.calls", tmp_path / "once.calls"
    deterministic = ex.submit(count_calls_and_raise, str(always), 99)
    one_off = ex.submit(count_calls_and_raise, str(once), 1)
    with pytest.raises(submitit.core.utils.FailedJobError, match="the same error every time"):
        deterministic.result()
    assert len(always.read_text().splitlines()) == 2
    assert one_off.result() == "ok"
    (fault,) = one_off.faults()
    assert (fault["kind"], fault["message"]) == ("exception", "ValueError: the same error every time")
    assert one_off.events()[-1]["event"] == "finished" and one_off.events()[-1]["faults"] == 1


@pytest.mark.parametrize(
    ("killed", "when"),
    [("supervisor", "importing"), ("supervisor", "training"), ("controller", "training")],
)
def test_a_job_process_killed_as_an_oom_kill_would_leaves_no_rank_after_5_s(tmp_path, killed, when):
    """The supervisor SIGKILLed: its ranks die with it, still importing torch (the parent-death
    signal) or training (that, and the closed liveness connection). submitit's controller
    (``job._process``) SIGKILLed: the supervisor stops its ranks as a cancel does."""
    job = executor(tmp_path).submit(train, 10_000, 256, 0.05)
    log_dir = run_dir(job.paths.folder, job.job_id)
    started = {"importing": log_dir / "events.jsonl", "training": log_dir / "step_times.jsonl"}[when]
    deadline = time.monotonic() + 120
    while not (started.exists() and started.stat().st_size):
        assert time.monotonic() < deadline and job._process.poll() is None, "the run never got there"
        time.sleep(0.1)
    os.kill(job_process(job) if killed == "supervisor" else job._process.pid, signal.SIGKILL)
    wait_processes_gone(log_dir, timeout=5)


def test_a_result_that_cannot_be_pickled_is_the_jobs_error_named(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=1, timeout_min=10, no_tiers=True)
    with pytest.raises(
        submitit.core.utils.FailedJobError, match="cannot be pickled: TypeError: cannot pickle"
    ):
        ex.submit(a_lock).result()


def test_a_cancelled_job_is_uncompleted_not_failed(tmp_path):
    """As under submitit's own executors: the function did not fail, it was stopped."""
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=1, timeout_min=10, no_tiers=True)
    job = ex.submit(time.sleep, 60)
    wait_event(job, "generation", timeout=60)
    time.sleep(3)  # the rank is in the function
    supervisor = job_process(job)
    job.cancel()
    deadline = time.monotonic() + 60
    while Path(f"/proc/{supervisor}").exists():  # it has written what it writes
        assert time.monotonic() < deadline, "the job's process outlived its cancel"
        time.sleep(0.1)
    job._results_timeout_s = 1  # submitit waits 15 s (x2 locally) for a result that never comes
    error = job.exception()  # submitit's FailedJobError is an UncompletedJobError too: the class itself
    assert type(error) is submitit.core.utils.UncompletedJobError, error


def wait_file(path: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} after {timeout:.0f} s"
        time.sleep(0.1)


def test_a_preempted_checkpointable_is_checkpointed_by_rank_0_and_resumes_from_it(tmp_path):
    """submitit's preemption locally: the job's own process gets the requeue signal long before
    its time limit; rank 0 (not rank 1) takes the checkpoint, and the job runs again from it."""
    ex = executor(tmp_path, nodes=2, spares=0, timeout_min=30)
    job = ex.submit(Resumable(), str(tmp_path))
    wait_file(tmp_path / "started0")
    wait_file(tmp_path / "started1")
    os.kill(job_process(job), signal.SIGUSR2)
    assert job.result() == "resumed from the checkpoint"
    assert (tmp_path / "checkpoint").read_text() == "0\n"
    (requeue,) = [e for e in job.events() if e["event"] == "requeue"]
    assert requeue["cause"] == "preemption"
    assert "Requeued job" in job.stdout()


def test_a_training_function_requeued_at_its_time_limit_resumes_from_the_persisted_step(tmp_path, fault_free):
    """The time limit locally: submitit's controller signals the job's process in its last minutes
    (here by hand once training is under way, 10 minutes being the window that counts as the time
    limit's, as under submitit). Every rank's ctx.on_requeue hook runs, the newest commit is
    persisted, the controller runs the job again and it resumes there, ending with the fault-free
    result. (test_requeuing in tests/submitit has the controller's own signal.)"""
    ckpt = str(tmp_path / "ckpt")
    ex = executor(tmp_path, spares=0, persistent_dir=ckpt, no_tiers=False, timeout_min=10)
    job = ex.submit(train_noting_requeues, str(tmp_path), STEPS, 0.3)
    wait_event(job, "checkpoint-saved")  # training is under way
    os.kill(job_process(job), signal.SIGUSR2)
    assert job.result() == fault_free
    (requeue,) = [e for e in job.events() if e["event"] == "requeue"]
    assert requeue["cause"] == "time-limit" and requeue["saved_step"] is not None
    restored = [e for e in job.events() if e["event"] == "restored"]
    assert restored and restored[-1]["step"] >= requeue["saved_step"]  # nothing persisted is lost
    hooks = {p.name: p.read_text() for p in tmp_path.glob("requeue*")}
    assert hooks == {f"requeue{rank}": "time-limit" for rank in range(3)}
