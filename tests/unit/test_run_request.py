"""``RunRequest`` (launcher.run.request): validation, its JSON, the CLI's reading into it, and the
configs ``supervise`` builds from it (launcher.run.configs). No process is started."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.cli import build_parser, run_command, run_options
from launcher.errors import ConfigError
from launcher.observability.straggler import StragglerConfig
from launcher.run import configs, environment
from launcher.run.request import RunOptions, RunRequest, preempt_signal_in
from launcher.slurm.srun_args import parse as parse_srun
from launcher.supervisor.config import RunConfig

CLEAN = {"PATH": "/usr/bin"}  # no SRES_* and no SLURM_* variables


def parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def test_the_options_are_the_environment_table():
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    assert fields == {v.dest for v in environment.VARIABLES if v.option}


def test_defaults_are_the_command_line_s_and_the_supervisor_s(monkeypatch):
    for variable in environment.VARIABLES:
        monkeypatch.delenv(variable.name, raising=False)
    args = parsed("run", "--nodes", "1", "--", "train")
    assert run_options.options_from_args(args, CLEAN) == RunOptions()
    config, options = RunConfig(command=("x",), nodes=1), RunOptions()
    same = ("standby", "backend", "replication_factor", "node_fault_after", "max_requeues")
    same += ("max_timeout_requeues", "preempt_signal", "metrics_addr", "metrics_port")
    assert all(getattr(options, name) == getattr(config, name) for name in same)
    assert (options.hang_timeout, options.reform_timeout) == (config.hang_timeout_s, config.reform_timeout_s)
    assert RunRequest((), 1).max_restarts == config.max_restarts
    straggler = StragglerConfig()
    assert (options.straggler_factor, options.straggler_steps, options.straggler_action) == (
        straggler.factor,
        straggler.steps,
        straggler.action,
    )


def test_values_are_read_as_their_field_s_type():
    options = RunOptions.from_values(
        {"hang_timeout": "5", "max_requeues": "none", "no_tiers": "yes", "inject": "kill:rank=0:step=1"}
    )
    assert (options.hang_timeout, options.max_requeues, options.no_tiers) == (5.0, None, True)
    assert options.inject == ("kill:rank=0:step=1",)
    request = RunRequest(["python", "x"], "2", options=RunOptions(log_dir="runs/a", standby=1))
    assert request.command == ("python", "x") and request.nodes == 2
    assert request.options.log_dir == Path("runs/a")


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: RunOptions(hang_timeout="soon"), "--hang-timeout: 'soon' is not a number"),
        (lambda: RunOptions(standby=True), "--standby: True is not a whole number"),
        (lambda: RunOptions(backend="mpi"), "--backend 'mpi': one of gloo, nccl"),
        (lambda: RunOptions(on_no_spare="pray"), "--on-no-spare 'pray': one of"),
        (lambda: RunOptions.from_values({"hang_timout": 3}), "unknown option --hang-timout"),
        (lambda: RunRequest(("x",), 1, placement="pbs"), "placement 'pbs': one of local, srun"),
        (lambda: RunRequest(("x",), "two"), "nodes: 'two' is not a whole number"),
        (
            lambda: RunRequest(("x",), 1, placement="srun", options=RunOptions(repair_after=1)),
            "--repair-after S",
        ),
        (lambda: RunRequest(("x",), 1, options=RunOptions(repair_after=-1)), "--repair-after S"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(build, words):
    with pytest.raises(ConfigError, match=words) as err:
        build()
    assert "\n" not in str(err.value)


def test_json_round_trip_and_refusals():
    options = RunOptions(inject=("node:1:step=3",), log_dir=Path("/tmp/r"), no_tiers=True, max_requeues=None)
    request = RunRequest(("python", "x"), 3, 2, 1, 4, "slurm", ("--gpus-per-task=1",), "gpu", options)
    assert RunRequest.from_json(request.to_json()) == request
    assert "\n" not in request.to_json()
    for text, words in (
        ("not json", "not a run request"),
        ('{"nodes": 1}', "not a run request"),
        ('{"command": [], "nodes": 1, "colour": 2}', "not a run request"),
        ('{"command": [], "nodes": 1, "options": {"standby": "x"}}', "--standby: 'x' is not a whole number"),
    ):
        with pytest.raises(ConfigError, match=words):
            RunRequest.from_json(text)


def test_the_latch_reads_the_signal_without_validating():
    request = RunRequest(("x",), 1, options=RunOptions(preempt_signal="TERM"))
    assert preempt_signal_in(request.to_json()) == "TERM"
    assert preempt_signal_in("garbage") is None and preempt_signal_in('{"options": 3}') is None


def test_sres_run_makes_a_request():
    args = parsed("run", "--nodes", "2", "--spares", "1", "--srun-arg=-c2", "--hang-timeout", "5", "--", "x")
    request = run_command.run_request(args, {"SLURM_JOB_ID": "7"})
    assert (request.command, request.nodes, request.spares, request.placement) == (("x",), 2, 1, "srun")
    assert request.step_args == ("-c2",) and request.options.hang_timeout == 5.0
    assert run_command.run_request(args, CLEAN).placement == "local"


def test_inject_comes_from_the_environment_unless_the_command_line_gives_it():
    env = {"SRES_INJECT": "kill:rank=0:step=2;node:1:step=3"}
    args = parsed("run", "--nodes", "2", "--", "x")
    assert run_options.options_from_args(args, env).inject == ("kill:rank=0:step=2", "node:1:step=3")
    args = parsed("run", "--nodes", "2", "--inject", "hang:rank=1:step=1", "--", "x")
    assert run_options.options_from_args(args, env).inject == ("hang:rank=1:step=1",)


def test_sres_srun_takes_its_shape_from_srun_and_the_allocation():
    argv = ["srun", *run_command.split_srun_argv(["--auto-resume=2", "--no-grow", "-N", "3", "-c", "4", "x"])]
    args = parsed(*argv)
    request = run_command.srun_request(args, parse_srun(args.srun_args[1:]), 4, CLEAN)
    assert (request.nodes, request.spares, request.max_restarts, request.placement) == (3, 1, 2, "srun")
    assert request.step_args == ("-c", "4") and request.options.no_grow
    args = parsed("srun", "--all-satellites", "--", "x")
    with pytest.raises(ConfigError, match="--all-satellites needs -N"):
        run_command.srun_request(args, parse_srun(["x"]), 4, CLEAN)


def test_srun_split_keeps_help_and_the_command_s_own_options():
    assert run_command.split_srun_argv(["-N", "2", "--help"]) == ["--help", "--", "-N", "2"]
    assert run_command.split_srun_argv(["--log-dir", "d", "x", "--log-dir", "y"]) == [
        "--log-dir",
        "d",
        "--",
        "x",
        "--log-dir",
        "y",
    ]


def test_the_log_dir_defaults_to_the_job_s_or_the_time():
    request = RunRequest(("x",), 1, placement="srun")
    assert configs.log_dir_for(request, {"SLURM_JOB_ID": "42"}, 0.0) == Path("sres-runs/job-42")
    local = dataclasses.replace(request, placement="local")
    assert str(configs.log_dir_for(local, {"SLURM_JOB_ID": "42"}, 0.0)).startswith("sres-runs/run-19")
    given = RunRequest(("x",), 1, options=RunOptions(log_dir="mine"))
    assert configs.log_dir_for(given, {}, 0.0) == Path("mine")


def test_the_run_config_carries_the_request(tmp_path):
    options = RunOptions(hang_timeout=5, persistent_dir=str(tmp_path / "p"), min_nodes=1, job_id="j")
    request = RunRequest(("python", "x"), 2, 2, 1, 4, options=options)
    injected, _ = configs.injections(
        dataclasses.replace(request, options=RunOptions(inject=("node:1:step=3",)))
    )
    config = configs.run_config(request, tmp_path, injected, {"SLURM_RESTART_COUNT": "2"})
    assert (config.world_size, config.spares, config.max_restarts, config.hang_timeout_s) == (4, 1, 4, 5.0)
    assert config.restart_count == 2 and config.injections[0].node == 1
    assert config.tiers.persist_every == 10 and config.tiers.job_id == "j"  # 10: only the directory was given
    assert config.elastic.min_nodes == 1 and config.elastic.max_nodes == 2


def test_config_errors_name_the_flags(tmp_path):
    with pytest.raises(ConfigError, match="--min-nodes"):
        configs.elastic_config(RunOptions(min_nodes=0))
    with pytest.raises(ConfigError, match="--straggler-factor"):
        configs.straggler_config(RunOptions(straggler_factor=0.5))
    with pytest.raises(ConfigError, match="unknown fault kind|inject"):
        configs.injections(RunRequest(("x",), 1, options=RunOptions(inject=("explode:rank=0",))))
