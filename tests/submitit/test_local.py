"""submitit's own ``submitit/local/test_local.py`` (submitit 1.5.4), with
``ResilientExecutor(folder, cluster="local")`` in place of ``LocalExecutor`` (and of
``AutoExecutor(cluster="local")`` in ``test_setup``); submitit's ``weird_tmp_path`` fixture is a
parametrization here. Nothing else is changed but the times of ``test_requeuing`` and
``test_custom_checkpoint``, scaled to our start-up (:data:`SLEEP_S`, :data:`SLACKER_TIMEOUT_S`),
and the mark of ``test_long_running_job``, one of submitit's slow tests (``-m slow`` runs it). Not ported:
``test_make_subprocess`` tests submitit's controller alone, with no executor.
"""

from __future__ import annotations

import functools
import pickle
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from submitit import helpers
from submitit.core import job_environment, test_core, utils
from submitit.local import local, test_debug

from launcher.submitit import ResilientExecutor


SLEEP_S, TIMEOUT_S, SIGNAL_DELAY_S = 5, 20, 3
"""test_requeuing's times, submitit's (1 s, 3 s, 1 s) scaled: a job here starts in about 2.5 s (the
supervisor, then a rank that imports torch) where LocalExecutor's starts in 0.3 s, so a 3-second
time limit ends it before the function starts. Scaled, the signal (at 17 s) still comes after one
to three of the functions ran for any start-up up to 12 s (a loaded machine), the second run times
out too, and there is time to requeue between the signal and the limit."""

SLACKER_TIMEOUT_S, SLACKER_SLEEP_S = 20, 30
"""test_custom_checkpoint's (submitit's: 2 s, and a 10-second sleep): the slacker must have started
slacking when the signal comes (at 17 s), and still be slacking. The signal came at 5 s, then at
9 s, and each time a loaded machine (CI: 2 cores, both lanes busy) had not started the rank yet,
so there was no checkpoint to make; 17 s is seven times our start-up, and the sleep outlasts it."""


def executor_at(folder: Path) -> ResilientExecutor:
    return ResilientExecutor(folder, cluster="local")


def local_executor_at(folder: Path, max_num_timeout: int) -> ResilientExecutor:
    return ResilientExecutor(folder, cluster="local", max_num_timeout=max_num_timeout)


def test_local_job(tmp_path: Path) -> None:
    def func(p: int) -> int:
        job_env = job_environment.JobEnvironment()
        return p * job_env.local_rank

    executor = executor_at(tmp_path)
    executor.update_parameters(tasks_per_node=3, nodes=1)
    job1 = executor.submit(func, 1)

    executor.update_parameters(tasks_per_node=1)

    with executor.batch():
        with pytest.raises(RuntimeError, match="with executor.batch"):
            executor.update_parameters(tasks_per_node=1)
        job2 = executor.submit(func, 2)
    assert job1.results() == [0, 1, 2]
    assert job1.task(1).result() == 1
    assert job1.task(2).result() == 2
    assert job1.task(2).result() == 2
    assert job1.exception() is None
    assert job1.done()

    with pytest.raises(ValueError, match="must be between 0 and 2"):
        job1.task(4).result()

    assert job2.results() == [0]
    assert job2.task(0).result() == 0
    # single task job is a regular job
    assert job2.task(0) is job2
    assert job2.done()
    # picklability
    b = pickle.dumps(job2)
    job3 = pickle.loads(b)
    assert job3.results() == [0]
    assert job3._process is not None
    del job2
    job3 = pickle.loads(b)
    assert job3._process is None, "garbage collection should I removed finished job"


def test_local_map_array(tmp_path: Path) -> None:
    g = test_debug.CheckFunction(5)
    executor = executor_at(tmp_path)
    jobs = executor.map_array(g, g.data1, g.data2)
    assert list(map(g, g.data1, g.data2)) == [j.result() for j in jobs]


def test_local_submit_array(tmp_path: Path) -> None:
    g = test_debug.CheckFunction(5)
    fns = [functools.partial(g, x, y) for x, y in zip(g.data1, g.data2)]
    executor = executor_at(tmp_path)
    jobs = executor.submit_array(fns)
    assert list(map(g, g.data1, g.data2)) == [j.result() for j in jobs]


def test_local_error(tmp_path: Path) -> None:
    def failing_job() -> None:
        raise RuntimeError("Failed on purpose")

    executor = executor_at(tmp_path)
    job = executor.submit(failing_job)
    exception = job.exception()
    assert isinstance(exception, utils.FailedJobError)
    traceback = exception.args[0]
    assert "Traceback" in traceback
    assert "Failed on purpose" in traceback


def test_get_first_task_error(tmp_path: Path) -> None:
    def flaky() -> None:
        job_env = job_environment.JobEnvironment()
        if job_env.local_rank > 0:
            raise RuntimeError(f"Failed on purpose: {job_env.local_rank}")

    executor = executor_at(tmp_path)
    executor.update_parameters(tasks_per_node=3, nodes=1)
    job = executor.submit(flaky)
    exception = job.exception()
    assert isinstance(exception, utils.FailedJobError)
    traceback = exception.args[0]
    assert "Traceback" in traceback
    assert "Failed on purpose: 1" in traceback


def test_pickle_output_from_main(tmp_path: Path) -> None:
    class MyClass:
        pass

    executor = executor_at(tmp_path)
    job = executor.submit(MyClass.__call__)
    assert isinstance(job.result(), MyClass)


def test_stdout(tmp_path: Path) -> None:
    def hello() -> None:
        job_env = job_environment.JobEnvironment()
        print("hello from", job_env.local_rank)
        print("bye from", job_env.local_rank, file=sys.stderr)

    executor = executor_at(tmp_path)
    executor.update_parameters(tasks_per_node=2, nodes=1)
    job = executor.submit(hello)

    job.wait()
    stdout = job.stdout()
    assert stdout is not None
    assert "hello from 0\n" in stdout
    assert "hello from 1\n" in stdout

    stderr = job.stderr()
    assert stderr is not None
    assert "bye from 0\n" in stderr
    assert "bye from 1\n" in stderr


def test_killed(tmp_path: Path) -> None:
    def failing_job() -> None:
        time.sleep(120)
        raise RuntimeError("Failed on purpose")

    executor = executor_at(tmp_path)
    job = executor.submit(failing_job)
    assert job.state == "RUNNING"
    job._process.send_signal(signal.SIGKILL)  # type: ignore
    time.sleep(1)
    assert job.state == "INTERRUPTED"


@pytest.mark.slow  # submitit's: skipped unless SUBMITIT_SLOW_TESTS; ours: out of CI, with -m slow
def test_long_running_job(tmp_path: Path) -> None:
    def f(x: int, y: int, sleep: int = 120) -> int:
        time.sleep(sleep)
        return x + y

    executor = executor_at(tmp_path)
    executor.update_parameters(timeout_min=5)
    job = executor.submit(f, 40, 2)
    assert job.result() == 42


def test_requeuing(tmp_path: Path) -> None:
    func = helpers.FunctionSequence(verbose=True)
    for x in range(20):
        func.add(test_core.do_nothing, x=x, sleep=SLEEP_S)
    executor = local_executor_at(tmp_path, max_num_timeout=1)
    executor.update_parameters(timeout_min=TIMEOUT_S / 60, signal_delay_s=SIGNAL_DELAY_S)
    job = executor.submit(func)
    job.wait()
    stdout = job.stdout()
    assert stdout is not None
    match = re.search(r"Starting from [123]/20", stdout)
    assert match, f"Should have resumed from a checkpoint:\n{stdout}"
    assert "timed-out too many times" in stdout, f"Unexpected stdout:\n{stdout}"
    assert "(0 remaining timeouts)" in stdout, f"Unexpected stdout:\n{stdout}"


def test_custom_checkpoint(tmp_path: Path) -> None:
    class Slacker(helpers.Checkpointable):
        def __call__(self, slack: bool = True):
            if slack:
                print("Slacking", flush=True)
                time.sleep(SLACKER_SLEEP_S)
                raise RuntimeError("I really don't want to work")
            print("Working hard", flush=True)
            return "worked hard"

        def __submitit_checkpoint__(self, slack: bool = True):
            if slack:
                print("Interrupted while slacking. I won't slack next time.", flush=True)
            return utils.DelayedSubmission(self, slack=False)

    executor = local_executor_at(tmp_path, max_num_timeout=1)
    executor.update_parameters(timeout_min=SLACKER_TIMEOUT_S / 60, signal_delay_s=SIGNAL_DELAY_S)
    job = executor.submit(Slacker(True))
    job.wait()
    stdout = job.stdout()
    assert stdout
    assert "I won't slack next time." in stdout


def test_cancel(tmp_path: Path) -> None:
    executor = executor_at(tmp_path)
    job = executor.submit(time.sleep, 10)
    assert job.state == "RUNNING"
    job.cancel()
    time.sleep(0.1)
    # Note: with local job we don't have a precise status.
    assert job.state == "INTERRUPTED"

    job = executor.submit(time.sleep, 10)
    process = job._process  # type: ignore
    job.cancel_at_deletion()
    assert job.state == "RUNNING"
    assert process.poll() is None
    del job
    time.sleep(0.1)
    assert process.poll() == -2


def f66(x: int, y: int = 0) -> int:  # pylint: disable=unused-argument
    return 66


def test_setup(tmp_path: Path) -> None:
    executor = executor_at(tmp_path)
    setup_file = tmp_path / "setup_done"
    executor.update_parameters(local_setup=[f"touch {setup_file}"])
    job = executor.submit(f66, 12)
    time.sleep(1)
    assert job.result() == 66
    assert setup_file.exists()


def test_load_submission(tmp_path: Path) -> None:
    """Check we can load submission just from a path and job id."""
    executor = executor_at(tmp_path)
    job = executor.submit(f66, 67, y=68)

    submission = local.LocalJob(tmp_path, job.job_id).submission()
    # It's important that f66 isn't a local function for the equality to work
    assert submission.function is f66
    assert submission.args == (67,)
    assert submission.kwargs == {"y": 68}
    # Loading submission doesn't evaluate them.
    assert submission._result is None


@pytest.mark.parametrize("name", ["a_0", "a 0", 'a"=0"', "a'; echo foo", r"a\=0", r"a\=", "a\n0"])
def test_weird_dir(tmp_path: Path, name: str) -> None:  # submitit's weird_tmp_path fixture, inlined
    executor = executor_at(tmp_path / name / "%j")
    executor.submit(f66, 67, 68).result()
