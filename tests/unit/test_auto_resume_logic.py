"""Pure parts of auto-resume: srun's command line, node verdicts, templates."""

from __future__ import annotations

import socket

import pytest

from launcher.slurm import templates
from launcher.placement import NodeEvidence
from launcher.errors import SlurmError
from launcher.placement.slurmd_probe import SLURM_SILENT_S, NodeProbe, slurmd_reach
from launcher.errors import ConfigError
from launcher.slurm.srun_args import parse, split_ours
from launcher.supervisor import RunConfig, node_verdict
from launcher.supervisor.policy.classify import UNREACHABLE


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


def test_a_dead_slurmd_and_a_node_cut_off_read_apart():
    """A refused connection to the slurmd port: the node's kernel answered, its slurmd is gone
    ("slurmd not responding"). No answer at all: the node is cut off or off ("unreachable"), and
    what runs there may be alive. A full accept queue drops a connection as a cut link does."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = server.getsockname()[1]
    assert slurmd_reach("127.0.0.1", port, 0.2) == "answers"
    queued = [socket.socket() for _ in range(2)]
    for sock in queued:  # the accept queue (never accepted) fills: the next handshake goes unanswered
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
    try:
        assert slurmd_reach("127.0.0.1", port, 0.2) == "silent"
    finally:
        for sock in queued:
            sock.close()
        server.close()
    assert slurmd_reach("127.0.0.1", port, 0.2) == "refused"
    assert node_verdict(NodeEvidence(slurmd_answers=False, reachable=False), 1, limit=2) == UNREACHABLE


def test_a_silent_slurmctld_is_not_asked_again_and_nodes_are_probed_where_they_were():
    """The supervisor's link cut: slurmctld's silence costs scontrol's retries once, not once a node;
    each node's slurmd is still probed, at the address Slurm gave before."""
    now, probed = [0.0], []
    silent = lambda address, port: probed.append((address, port)) or "silent"  # noqa: E731 - nothing is contacted
    probe = NodeProbe({"n2": ("10.0.0.12", 6818)}, silent, lambda: now[0])
    probe.check_slurm()  # not silent yet: ask
    probe.slurm_failed(SlurmError("Unable to contact slurm controller"))
    with pytest.raises(SlurmError, match="Unable to contact"):
        probe.check_slurm()
    assert probe.reach("n2") == "silent" and probed == [("10.0.0.12", 6818)]
    assert probe.reach("n9") == "refused"  # never known: not probed
    now[0] = SLURM_SILENT_S
    probe.check_slurm()  # asked again
    assert probe.reach("n2", "10.0.0.22", 7000) == "silent" and probed[-1] == ("10.0.0.22", 7000)


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
