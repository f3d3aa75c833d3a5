"""``sres run`` and ``sres srun``: their options made into a ``RunRequest``, run by ``supervise``.

``sres run`` names the run's shape itself (``--nodes``, ``--procs-per-node``, ``--spares``) and
runs on simulated nodes, or on the Slurm job's nodes inside an allocation. ``sres srun`` (what
``srun --auto-resume`` runs) reads the shape from srun's own command line, and takes the
allocation's nodes beyond ``-N`` as spares.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from launcher.cli import run_options
from launcher.errors import ConfigError, NotInAllocation
from launcher.run import environment
from launcher.run.request import RunRequest
from launcher.slurm.client import SlurmClient
from launcher.slurm.srun_args import SrunRequest, parse, split_ours


def add_parsers(sub: argparse._SubParsersAction) -> None:
    _add_run_command(sub)
    _add_srun_command(sub)


def run_request(args: argparse.Namespace, environ: Mapping[str, str]) -> RunRequest:
    """``sres run``'s request; ``--placement auto``: srun steps inside an allocation, else local."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    placement = args.placement
    if placement == "auto":
        placement = "srun" if environ.get("SLURM_JOB_ID") else "local"
    return RunRequest(
        command=tuple(command),
        nodes=args.nodes,
        procs_per_node=args.procs_per_node,
        spares=args.spares,
        max_restarts=args.max_restarts,
        placement=placement,
        step_args=tuple(args.srun_arg),
        options=run_options.options_from_args(args, environ),
    )


def srun_request(
    args: argparse.Namespace, srun: SrunRequest, held: int, environ: Mapping[str, str]
) -> RunRequest:
    """``sres srun``'s request in a job that holds ``held`` healthy nodes: without ``-N``, every
    node but the spares holds ranks; without ``--spares``, every node beyond ``-N`` is one."""
    options = run_options.options_from_args(args, environ)
    if options.all_satellites and srun.nodes is None:
        raise ConfigError("sres srun --all-satellites needs -N (the nodes that hold ranks, all satellites)")
    nodes = srun.nodes if srun.nodes is not None else held - (srun.spares or 0)
    spares = srun.spares
    if spares is None:
        spares = 0 if options.all_satellites else max(0, held - nodes)
    return RunRequest(
        command=srun.command,
        nodes=nodes,
        procs_per_node=srun.procs_per_node,
        spares=spares,
        max_restarts=srun.retries,
        placement="srun",
        step_args=srun.step_args,
        partition=srun.partition,
        options=options,
    )


def split_srun_argv(argv: Sequence[str]) -> list[str]:
    """``sres srun``'s arguments in an order argparse can parse: srun's options and ours may
    interleave before the command, so ours come first, then ``--`` and srun's line."""
    ours = {**environment.options(), "-h": False, "--help": False}
    mine, theirs = split_ours(argv, ours)
    return [*mine, "--", *theirs]


def _cmd_run(args: argparse.Namespace) -> int:
    from launcher.run.supervise import supervise  # the supervisor, loaded only to run

    return supervise(run_request(args, os.environ))


def _cmd_srun(args: argparse.Namespace) -> int:
    from launcher.placement.srun import place
    from launcher.run.supervise import supervise

    if not os.environ.get("SLURM_JOB_ID"):
        raise NotInAllocation(
            "sres srun runs inside a Slurm allocation (SLURM_JOB_ID is unset): "
            "use it in an sbatch script or under salloc"
        )
    srun = parse(args.srun_args[1:] if args.srun_args[:1] == ["--"] else args.srun_args)
    job_hosts = place(SlurmClient.create("auto", timeout_s=30.0), os.environ, 1)
    request = srun_request(args, srun, len(job_hosts.hosts), os.environ)
    return supervise(request, job_hosts=job_hosts)


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training command on N nodes (simulated, or the Slurm job's) with in-process recovery",
        description="Start N nodes x P ranks plus S warm spare nodes; "
        "the supervisor hosts the coordination store, "
        "watches every rank and recovers from faults in-process. Outside Slurm the nodes are simulated on "
        "this machine; inside an allocation ranks run as srun steps on the job's nodes. "
        "Example: sres run --nodes 4 --spares 1 -- python -m resilience.examples.train_mlp",
    )
    p.add_argument("--nodes", type=int, required=True, help="number of nodes that hold ranks")
    p.add_argument("--procs-per-node", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="warm spare nodes: processes started and waiting, torch imported, to take a lost node's ranks",
    )
    p.add_argument(
        "--placement",
        "--launcher",  # the old spelling, whose "slurm" is "srun"
        dest="placement",
        choices=["auto", "local", "srun", "slurm"],
        default="auto",
        help="where ranks run: simulated nodes on this machine, or srun steps of the Slurm job "
        "(default: srun inside an allocation, else local)",
    )
    p.add_argument(
        "--srun-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --placement srun: an option for every rank's srun step (repeatable), "
        "e.g. --gpus-per-task=1",
    )
    max_restarts = RunRequest.__dataclass_fields__["max_restarts"].default
    p.add_argument(
        "--max-restarts",
        type=int,
        default=max_restarts,
        help=f"give up after this many faults (default {max_restarts})",
    )
    run_options.add_supervision_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...: the training command")
    p.set_defaults(func=_cmd_run)


def _add_srun_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "srun",
        help="srun with auto-resume, inside an allocation: what 'srun --auto-resume=N' runs",
        description="Run srun's command as ranks supervised by sres inside the current Slurm allocation: "
        "on a fault "
        "the bad node is drained ('sres: <what was seen>'), its ranks move to a spare node of the "
        "allocation or to a node the job grows into, survivors keep their state in memory, and when "
        "no node is left the job requeues itself. Spare nodes default to the allocation's nodes beyond -N. "
        "Example (in an sbatch -N 4 script): sres srun --auto-resume=3 -N 3 python train.py",
        usage="sres srun [--auto-resume[=N]] [--spares S] [srun options] COMMAND...",
    )
    run_options.add_supervision_options(p)
    p.add_argument(
        "srun_args",
        nargs=argparse.REMAINDER,
        help="--auto-resume=N (faults to recover from, default 1), --spares S, srun options, the command",
    )
    p.set_defaults(func=_cmd_srun)
