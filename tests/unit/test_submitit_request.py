"""``ResilientExecutor``'s parameters become the ``RunRequest`` its job process runs, and that
process completes it (launcher.submitit, launcher.submitit_job). Nothing is submitted."""

from __future__ import annotations

import time
import shlex
from pathlib import Path

import pytest

from launcher import submitit_job
from launcher.run import environment, signal_latch
from launcher.run.request import RunRequest
from launcher.placement.local import LocalPlacement
from launcher.submitit import ResilientExecutor


@pytest.fixture(autouse=True)
def no_sres_variables(monkeypatch):
    for variable in environment.VARIABLES:
        monkeypatch.delenv(variable.name, raising=False)


def job_request(ex: ResilientExecutor) -> RunRequest:
    """The request on the job's command line, as the job process reads it."""
    argv = shlex.split(ex._executor._submitit_command_str)
    assert argv[-4:-2] == ["launcher.submitit_job", str(ex._executor.folder)]
    assert argv[-2] == submitit_job.REQUEST
    return RunRequest.from_json(argv[-1])


def test_a_local_job_runs_the_shape_and_options_given(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=3, spares=1, tasks_per_node=2, max_restarts=5, timeout_min=10)
    ex.update_parameters(inject=["node:1:step=8"], hang_timeout=3, no_tiers=True, min_nodes=2)
    request = job_request(ex)
    assert (request.nodes, request.spares, request.procs_per_node, request.max_restarts) == (3, 1, 2, 5)
    assert (request.placement, request.command, request.step_args) == ("local", (), ())
    o = request.options
    assert (o.inject, o.hang_timeout, o.no_tiers, o.min_nodes) == (("node:1:step=8",), 3.0, True, 2)
    # requeues as submitit's: max_num_timeout (3) at the time limit, preemptions uncapped
    assert (o.max_requeues, o.max_timeout_requeues) == (None, 3)


def test_a_slurm_job_asks_for_nodes_and_spares_and_requeues_as_submitit_does(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm", max_num_timeout=2)
    ex.update_parameters(nodes=2, spares=1, timeout_min=30, preempt_signal="SIGTERM")
    request = job_request(ex)
    assert (request.placement, request.nodes, request.spares, request.max_restarts) == ("srun", 2, 1, 3)
    assert (request.options.max_timeout_requeues, request.options.max_requeues) == (2, None)
    script = ex._executor._make_submission_file_text(ex._executor._submitit_command_str, "id")
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --signal=B:TERM@120\n" in script
    assert "#SBATCH --requeue\n" in script and "#SBATCH --no-kill\n" in script
    assert "#SBATCH --open-mode=append\n" in script  # rank 0 writes task 0's log beside the batch script
    assert "\nexec " in script
    ex.update_parameters(max_requeues=5)
    assert job_request(ex).options.max_requeues == 5  # given: it caps preemptions too


def test_options_not_given_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SRES_HANG_TIMEOUT", "7")
    monkeypatch.setenv("SRES_INJECT", "kill:rank=0:step=2")
    monkeypatch.setenv("SRES_LOG_DIR", "/elsewhere")  # the job's log dir is its own
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    options = job_request(ex).options
    assert (options.hang_timeout, options.inject, options.log_dir) == (7.0, ("kill:rank=0:step=2",), None)
    ex.update_parameters(hang_timeout=4, inject=[])
    assert job_request(ex).options.hang_timeout == 4.0 and job_request(ex).options.inject == ()


@pytest.mark.parametrize(
    "parameters, words",
    [
        ({"hang_timout": 3}, "unknown parameter 'hang_timout': not a submitit or sres option"),
        ({"log_dir": "x"}, "unknown parameter 'log_dir'"),
        ({"hang_timeout": "soon"}, "--hang-timeout: 'soon' is not a number"),
        ({"backend": "mpi"}, "--backend 'mpi'"),
        ({"spares": -1}, "spares=-1"),
    ],
)
def test_a_bad_parameter_is_refused_at_once_and_changes_nothing(tmp_path, parameters, words):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=2, hang_timeout=3)
    before = ex._executor._submitit_command_str
    with pytest.raises(ValueError, match=words):
        ex.update_parameters(**parameters)
    assert ex._executor._submitit_command_str == before


def test_the_job_completes_the_request_with_its_rank_command_and_log_dir(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("launcher.run.supervise.supervise", lambda request, rerun: seen.append(request) or 0)
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(nodes=2, no_tiers=True)
    rank = ("python", "-u", "-m", "resilience.submitit_rank", "in.pkl", "out.pkl")
    json = job_request(ex).to_json()
    assert submitit_job._run([submitit_job.REQUEST, json], rank, tmp_path / "7_sres", None) == 0
    (request,) = seen
    assert request.command == rank and request.options.log_dir == tmp_path / "7_sres"
    assert (request.nodes, request.options.no_tiers) == (2, True)


def test_a_job_submitted_before_requests_still_runs_its_command_line(monkeypatch):
    seen = []
    monkeypatch.setattr("launcher.cli.run", lambda argv: seen.append(argv) or 0)
    submitit_job._run(["--", "run", "--nodes", "2", "--"], ("python", "r.py"), Path("/j/7_sres"), None)
    assert seen == [["run", "--log-dir", "/j/7_sres", "--nodes", "2", "--", "python", "r.py"]]


def test_under_submitit_s_local_controller_a_run_is_requeued_by_its_exit_code_within_its_time_limit(
    monkeypatch,
):
    monkeypatch.delenv("SUBMITIT_LOCAL_JOB_ID", raising=False)
    assert submitit_job._local_rerun([]) is None  # on Slurm: Slurm's requeue and limit
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "7")
    monkeypatch.setenv("SUBMITIT_LOCAL_TIMEOUT_S", "90")
    monkeypatch.setattr(submitit_job, "STARTED", time.monotonic())  # as if this process were the job's
    earlier = [{"event": "start"}, {"event": "requeue", "cause": "time-limit"}, {"event": "start"}]
    rerun = submitit_job._local_rerun(earlier)
    assert (rerun.exit_code, rerun.time_limit_s, rerun.restart_count) == (144, 90.0, 1)
    left, limit = LocalPlacement(Path("/nowhere"), rerun=rerun).time_limits()
    assert limit == 90.0 and 0 < left <= 90.0
    assert LocalPlacement(Path("/nowhere")).time_limits() == (None, None)  # sres run: no limit


def test_the_job_latches_the_request_s_signal(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(preempt_signal="TERM")
    assert signal_latch.request_signal_name(job_request(ex).to_json()) == "SIGTERM"
    assert signal_latch.request_signal_name("not a request") == "SIGUSR2"


def test_the_job_refuses_a_command_line_it_cannot_read(capsys):
    assert submitit_job.main(["folder", "--what"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_autoexecutors_generic_names_reach_sbatch_as_submitit_converts_them(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="slurm")
    given = dict(
        nodes=2,
        mem_gb=4,
        cpus_per_task=3,
        gpus_per_node=1,
        timeout_min=30,
        name="mine",
        slurm_setup=["export HELLO=1"],
        slurm_signal_delay_s=90,
        slurm_partition="debug",
    )
    ex.update_parameters(**given)
    script = ex._executor._make_submission_file_text(ex._executor._submitit_command_str, "id")
    for line in (
        "--mem=4GB",
        "--cpus-per-task=3",
        "--gpus-per-node=1",
        "--time=30",
        "--job-name=mine",
        "--partition=debug",
        "--signal=B:USR2@90",
    ):
        assert f"#SBATCH {line}\n" in script
    assert "\nexport HELLO=1\n" in script
    assert ex.parameters == given  # as submitit users read them back


def test_local_names_and_autoexecutors_local_prefix_are_taken(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local", max_pickle_size_gb=0.5)
    ex.update_parameters(local_setup=["touch here"], signal_delay_s=5, mem_gb=2, slurm_partition="x")
    backend = ex._executor.parameters
    assert (backend["setup"], backend["signal_delay_s"], backend["mem_gb"]) == (["touch here"], 5, 2)
    assert "partition" not in backend and "slurm_partition" not in backend  # Slurm's, ignored here
    assert ex.max_pickle_size_gb == 0.5
    ex.max_pickle_size_gb = 2.0
    assert ex._executor.max_pickle_size_gb == 2.0
    with pytest.raises(ValueError, match="signal_delay_s=-1"):
        ex.update_parameters(signal_delay_s=-1)


@pytest.mark.parametrize(
    ("sbatch", "environ", "files", "slurm"),
    [
        (None, {"SLURM_CONF": "/c/slurm.conf"}, {"/c/slurm.conf"}, False),  # no client: never Slurm
        ("/usr/bin/sbatch", {}, set(), False),  # slurm-client installed, no cluster configured
        ("/usr/bin/sbatch", {}, {"/etc/slurm/slurm.conf"}, True),
        ("/usr/bin/sbatch", {}, {"/run/slurm/conf/slurm.conf"}, True),  # configless mode's cache
        ("/usr/bin/sbatch", {"SLURM_CONF": "/c/slurm.conf"}, {"/c/slurm.conf"}, True),
        (
            "/usr/bin/sbatch",
            {"SLURM_CONF": "/gone.conf"},
            {"/etc/slurm/slurm.conf"},
            False,
        ),  # sbatch reads SLURM_CONF
        ("/usr/bin/sbatch", {"SLURM_JOB_ID": "7"}, set(), True),  # inside an allocation
    ],
)
def test_the_executor_chooses_slurm_only_where_a_cluster_is_configured(sbatch, environ, files, slurm):
    from launcher.slurm.discovery import cluster_configured

    assert cluster_configured(environ, files.__contains__, lambda _name: sbatch) is slurm
