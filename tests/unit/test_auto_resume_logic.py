"""Pure parts of auto-resume: srun's command line, node verdicts, templates, liveness."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from launcher.slurm import templates
from launcher.placement import NodeEvidence
from launcher.errors import ConfigError
from launcher.slurm.srun_args import parse, split_ours
from launcher.supervisor import RunConfig, node_verdict
from resilience.contract.liveness import LivenessServer, announce


def test_srun_line_splits_into_shape_step_options_and_command():
    req = parse(
        [
            "--auto-resume=2",
            "-N",
            "3",
            "--ntasks-per-node=2",
            "--gpus-per-task=1",
            "-c",
            "4",
            "python",
            "train.py",
            "-N",
            "9",
        ]
    )
    assert (req.retries, req.nodes, req.procs_per_node, req.spares) == (2, 3, 2, None)
    assert req.step_args == ("--gpus-per-task=1", "-c", "4")
    assert req.command == ("python", "train.py", "-N", "9")  # the command's own options are its own


@pytest.mark.parametrize(
    "argv, shape",
    [
        (["--auto-resume", "-N2", "x"], (1, 2, 1)),
        (["-n", "8", "-N", "4", "x"], (1, 4, 2)),
        (["--ntasks=6", "--ntasks-per-node=3", "x"], (1, 2, 3)),
        (["--", "x", "--auto-resume=5"], (1, None, 1)),
    ],
)
def test_srun_shapes(argv, shape):
    req = parse(argv)
    assert (req.retries, req.nodes, req.procs_per_node) == shape


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-N", "2"], "no command given"),
        (["-n", "5", "-N", "2", "x"], "-n 5 needs -N"),
        (["--nodelist=n1", "x"], "--nodelist cannot be used"),
        (["--auto-resume=many", "x"], "not a whole number"),
        (["-N"], "needs a value"),
    ],
)
def test_srun_lines_refused_with_a_reason(argv, words):
    with pytest.raises(ConfigError, match=words):
        parse(argv)


def test_sres_options_are_picked_out_of_srun_options():
    mine, rest = split_ours(
        ["--auto-resume=1", "--log-dir", "/x", "-N", "3", "--no-grow", "python", "--log-dir", "y"],
        {"--log-dir": True, "--no-grow": False},
    )
    assert mine == ["--log-dir", "/x", "--no-grow"]
    assert rest == ["--auto-resume=1", "-N", "3", "python", "--log-dir", "y"]


@pytest.mark.parametrize(
    "evidence, faults, verdict",
    [
        (NodeEvidence(), 1, None),
        (NodeEvidence(slurmd_answers=False), 1, "slurmd not responding"),
        (
            NodeEvidence(slurm_usable=False, slurm_state="IDLE+DRAIN", slurm_reason="sres: gpu: xid 79"),
            1,
            "slurm reports IDLE+DRAIN (sres: gpu: xid 79)",
        ),
        (NodeEvidence(), 2, "repeated failure: 2 process faults on this node"),
    ],
)
def test_node_verdict(evidence, faults, verdict):
    assert node_verdict(evidence, faults, limit=2) == verdict


def test_usr1_is_refused_as_preemption_signal():
    with pytest.raises(ConfigError, match="NCCL may use SIGUSR1"):
        RunConfig(command=("x",), nodes=1, preempt_signal="SIGUSR1")


def test_templates_fill_every_placeholder_and_derive_total_nodes():
    for name in templates.names():
        text = templates.load(name).fill({"nodes": "5", "spares": "2"})
        assert "{{" not in text and "#@ nodes = 5" in text
        assert "--requeue" in text and "--signal=B:USR2@" in text and "USR1@" not in text
        if name == "train_supervisor_apart.sbatch":  # the job is the supervisor's CPU; nodes are satellites
            assert (
                "#SBATCH --nodes=1\n" in text
                and "--all-satellites" in text
                and "--nodes=5 --spares=2" in text
            )
        else:
            assert "#SBATCH --nodes=7\n" in text and "--no-kill" in text
    with pytest.raises(ConfigError, match="no template 'nope'"):
        templates.load("nope")


@pytest.mark.local  # spawns: the announcing process it kills
def test_liveness_sees_a_killed_process_at_once():
    server = LivenessServer()
    try:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import sys, time; from resilience.contract.liveness import announce; "
                    f"s = announce('127.0.0.1', {server.port}, 'n0p0', '7'); print('up', flush=True); "
                    "time.sleep(60)"
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.getcwd(),
        )
        assert child.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 5
        while server.peer("n0p0") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.peer("n0p0").step_id == "7" and server.lost_at("n0p0") is None
        child.kill()
        killed = time.monotonic()
        child.wait()
        while server.lost_at("n0p0") is None and time.monotonic() < killed + 5:
            time.sleep(0.005)
        assert server.lost_at("n0p0") is not None and server.lost_at("n0p0") - killed < 1.0
    finally:
        server.close()


@pytest.mark.local  # sleeps 0.2 s for the server thread
def test_liveness_ignores_a_connection_that_never_said_hello():
    server = LivenessServer()
    try:
        with socket.create_connection(("127.0.0.1", server.port)):
            pass
        sock = announce("127.0.0.1", server.port, "n1p0")
        time.sleep(0.2)
        assert server.peer("n1p0") is not None and server.lost_at("n1p0") is None
        sock.close()
    finally:
        server.close()
