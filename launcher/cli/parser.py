"""``sres``: the one command-line entry point (Slurm RESilience).

Errors a user can cause (:class:`SresError`) print one line and exit 1; usage errors exit 2
(argparse). Anything else is our bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.cli import chaos as chaos_cli
from launcher.cli import ckpt as ckpt_cli
from launcher.cli import doctor
from launcher.cli import elastic as elastic_cli
from launcher.cli import job_control
from launcher.cli import observability_options as observability_cli
from launcher.cli import simulate as simulate_cli
from launcher.observability import report
from launcher.slurm.satellites import GROW_BY
from launcher.errors import ConfigError, SresError
from launcher.observability.events import read_events
from launcher.run import environment
from launcher.slurm.client import SlurmClient


def _cmd_doctor(args: argparse.Namespace) -> int:
    needed = args.slurm or bool(os.environ.get("SLURM_JOB_ID"))
    findings = doctor.run_checks(
        os.environ, needed, lambda: SlurmClient.create(args.backend, timeout_s=args.timeout)
    )
    print(doctor.render(findings))
    failed = [f for f in findings if f.status is doctor.Status.FAIL]
    if failed:
        print(f"\n{len(failed)} problem(s): {', '.join(f.name for f in failed)}", file=sys.stderr)
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    launcher = (
        args.launcher if args.launcher != "auto" else ("slurm" if os.environ.get("SLURM_JOB_ID") else "local")
    )
    return _supervise(
        args,
        tuple(command),
        args.nodes,
        args.procs_per_node,
        args.spares,
        args.max_restarts,
        launcher,
        step_args=tuple(args.srun_arg),
        partition=None,
    )


def _cmd_srun(args: argparse.Namespace) -> int:
    from launcher.placement.srun import place
    from launcher.errors import NotInAllocation
    from launcher.slurm.srun_args import parse

    if not os.environ.get("SLURM_JOB_ID"):
        raise NotInAllocation(
            "sres srun runs inside a Slurm allocation (SLURM_JOB_ID is unset): "
            "use it in an sbatch script or under salloc"
        )
    request = parse(args.srun_args[1:] if args.srun_args[:1] == ["--"] else args.srun_args)
    job_hosts = place(_client(), os.environ, 1)
    held = len(job_hosts.hosts)
    if args.all_satellites and request.nodes is None:
        raise ConfigError("sres srun --all-satellites needs -N (the nodes that hold ranks, all satellites)")
    nodes = request.nodes if request.nodes is not None else held - (request.spares or 0)
    spares = (
        request.spares if request.spares is not None else (0 if args.all_satellites else max(0, held - nodes))
    )
    return _supervise(
        args,
        request.command,
        nodes,
        request.procs_per_node,
        spares,
        request.retries,
        "slurm",
        step_args=request.step_args,
        partition=request.partition,
        job_hosts=job_hosts,
    )


def _supervise(
    args: argparse.Namespace,
    command: tuple[str, ...],
    nodes: int,
    procs_per_node: int,
    spares: int,
    max_restarts: int,
    launcher: str,
    step_args: tuple[str, ...],
    partition: str | None,
    job_hosts=None,
) -> int:
    """Build the run's config and placement, run the supervisor, and turn its outcome into an exit code."""
    from launcher.supervisor import RunConfig, Supervisor
    from resilience.agent import fault_schedule
    from resilience.contract.injections import InjectSpecError

    try:
        # --inject on the command line wins; SRES_INJECT serves under sbatch.
        specs = args.inject or [s for s in (os.environ.get("SRES_INJECT") or "").split(";") if s.strip()]
        injections, schedules = fault_schedule.injections_from(specs, nodes * procs_per_node)
    except InjectSpecError as err:
        raise ConfigError(str(err)) from None
    job_id = os.environ.get("SLURM_JOB_ID")
    restart_count = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    log_dir = Path(
        args.log_dir or (f"sres-runs/job-{job_id}" if launcher == "slurm" and job_id else _default_log_dir())
    )
    if schedules:  # printed and kept: a failing seed replays exactly
        for line in schedules:
            print(f"sres: {line}", file=sys.stderr, flush=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "fault-schedule.json").write_text(
            json.dumps({"specs": list(specs), "injections": [i.spec for i in injections]}, indent=1) + "\n"
        )
    config = RunConfig(
        command=command,
        nodes=nodes,
        procs_per_node=procs_per_node,
        spares=spares,
        standby=args.standby,
        injections=injections,
        log_dir=log_dir,
        backend=args.backend,
        hang_timeout_s=args.hang_timeout,
        reform_timeout_s=args.reform_timeout,
        max_restarts=max_restarts,
        replication_factor=args.replication_factor,
        node_fault_after=args.node_fault_after,
        max_requeues=args.max_requeues,
        max_timeout_requeues=args.max_timeout_requeues,
        restart_count=restart_count,
        timeout_requeues=timeout_requeues(log_dir, restart_count),
        preempt_signal=args.preempt_signal,
        tiers=ckpt_cli.tier_config(args, log_dir),
        elastic=elastic_cli.elastic_config(args),
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
        metrics_textfile=args.metrics_textfile,
        straggler=observability_cli.straggler_config(args),
    )
    placement = liveness = None
    if args.repair_after is not None and (launcher == "slurm" or args.repair_after < 0):
        raise ConfigError(
            "--repair-after S (S >= 0) simulates repairs of local nodes; on Slurm, resume the node"
        )
    if launcher == "slurm":
        placement, liveness = _srun_placement(args, log_dir, nodes + spares, step_args, partition, job_hosts)
        hosts = ", ".join(placement.hosts[: nodes + spares])
        where = f"job {placement.job_id} ({hosts})"
    else:
        from launcher.placement.local import LocalPlacement

        placement = LocalPlacement(log_dir, repair_after_s=args.repair_after)
        where = "this machine"
    print(
        f"sres: {config.nodes} node(s) x {config.procs_per_node} rank(s), {config.spares} spare node(s) on {where}; "
        f"log dir {config.log_dir}",
        file=sys.stderr,
    )
    outcome = Supervisor(config, placement, liveness).run()
    print(f"sres: the run's report: sres report {config.log_dir}", file=sys.stderr)
    if outcome.requeued:
        return 0  # Slurm ends this batch script now; the job runs again from its saved state
    return 0 if outcome.ok else 1


def _srun_placement(
    args: argparse.Namespace,
    log_dir: Path,
    needed: int,
    step_args: tuple[str, ...],
    partition: str | None,
    job_hosts,
):
    """Ranks as srun steps of this job (and its satellites), and the run recorded in the job's Comment."""
    from launcher.placement.srun import SrunPlacement, place
    from resilience.contract.liveness import LivenessServer

    client = _client()
    if job_hosts is None or (len(job_hosts.hosts) < needed and not args.all_satellites):
        job_hosts = place(
            client, os.environ, 1 if args.all_satellites else needed
        )  # says clearly what is missing
    liveness = LivenessServer()
    placement = SrunPlacement(
        client,
        job_hosts,
        log_dir,
        liveness,
        srun_args=step_args,
        partition=partition,
        grow=not args.no_grow,
        grow_by=args.grow_by,
        lend_partition=args.lend_partition,
        satellite_nodes=needed if args.all_satellites else 0,
    )
    job_control.register(client, placement.job_id, log_dir)
    return placement, liveness


def _client() -> SlurmClient:
    return SlurmClient.create("auto", timeout_s=30.0)


def _cmd_demo(args: argparse.Namespace) -> int:
    from launcher.cli.demo import DemoConfig, main

    return main(DemoConfig(steps=args.steps, width=args.width, log_dir=Path(args.log_dir)))


def _cmd_template(args: argparse.Namespace) -> int:
    from launcher.slurm import templates

    if args.name is None:
        for name in templates.names():
            print(f"{name:28} {templates.load(name).summary}")
        return 0
    template = templates.load(args.name)
    if args.show_variables:
        for key, default in template.variables.items():
            print(f"{key} = {default}")
        return 0
    sys.stdout.write(template.fill(templates.parse_sets(args.set)))
    return 0


def _default_log_dir() -> str:
    return time.strftime("sres-runs/run-%Y%m%d-%H%M%S")


def _count_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a count, or 'none'") from None


def timeout_requeues(log_dir: Path, restart_count: int) -> int:
    """Requeues this job made at its time limit: its earlier runs' ``requeue`` events in the
    same log dir (a requeued job keeps its id, so its log dir)."""
    path = log_dir / "events.jsonl"
    if restart_count == 0 or not path.exists():
        return 0
    return sum(1 for e in read_events(path) if e["event"] == "requeue" and e.get("cause") == "time-limit")


def _run_default(field: str):
    """RunConfig's default for a field: the command line repeats no default."""
    from launcher.supervisor.config import RunConfig

    return RunConfig.__dataclass_fields__[field].default


def _add_capacity_options(p: argparse.ArgumentParser) -> None:
    """Where a Slurm run's nodes come from beyond its own allocation."""
    p.add_argument(
        "--no-grow",
        action="store_true",
        help="in a Slurm job: never add nodes (satellites or expansion); requeue when no spare node is left",
    )
    p.add_argument(
        "--grow-by",
        choices=GROW_BY,
        default="satellite",
        help="in a Slurm job: how the run gains a node when it has no spare or idle one, and how it grows "
        "into idle nodes below --max-nodes: a one-node job of yours whose node runs rank steps "
        "(satellite, the default), or job expansion where the cluster permits it (sres doctor says)",
    )
    p.add_argument(
        "--all-satellites",
        action="store_true",
        help="in a Slurm job: every node that holds ranks (and every spare) is a satellite; this job's own "
        "node runs only the supervisor and its store, so losing any training node, rank 0's "
        "included, never loses them (submit this job to a small CPU partition; "
        "sbatch_templates/train_supervisor_apart.sbatch)",
    )
    p.add_argument(
        "--lend-partition",
        metavar="P",
        help="in a Slurm job: the partition satellites are submitted to (default: the job's own), e.g. a "
        "low-priority preemptible one whose idle nodes the scheduler lends and takes back",
    )


def _add_supervision_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault to inject (repeatable): kill|raise|hang|kill-during-commit|kill-during-copy:rank=R:step=S "
        "or node:N:step=S (see resilience/agent/faults.py for all); "
        "also SRES_INJECT='SPEC;SPEC'",
    )
    p.add_argument(
        "--log-dir",
        help="where events.jsonl and rank logs go (default $SRES_LOG_DIR, else "
        "sres-runs/job-<id> in a Slurm job, else sres-runs/run-<time>)",
    )
    d = _run_default
    p.add_argument(
        "--standby",
        type=int,
        default=d("standby"),
        metavar="N",
        help="warm standby processes per node (default 0): a rank whose process dies on a healthy node is "
        "taken over by one, without Python and torch starting on the recovery path (costs one idle "
        "process's memory per node)",
    )
    p.add_argument(
        "--backend", choices=["gloo", "nccl"], default=d("backend"), help="torch.distributed backend"
    )
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=d("hang_timeout_s"),
        help=f"seconds without heartbeat before a rank is declared hung (default {d('hang_timeout_s'):g})",
    )
    p.add_argument(
        "--reform-timeout",
        type=float,
        default=d("reform_timeout_s"),
        help=f"seconds to wait for every rank of a new generation (default {d('reform_timeout_s'):g})",
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=d("replication_factor"),
        help=f"copies of each sharded state shard (default {d('replication_factor')})",
    )
    p.add_argument(
        "--node-fault-after",
        type=int,
        default=d("node_fault_after"),
        help=f"process faults on one node after which the node is drained and replaced "
        f"(default {d('node_fault_after')})",
    )
    p.add_argument(
        "--max-requeues",
        type=_count_or_none,
        default=d("max_requeues"),
        help=f"in a Slurm batch job: requeue at most this many times (SLURM_RESTART_COUNT; "
        f"'none': no cap of ours, Slurm's MaxBatchRequeue still applies; default {d('max_requeues')})",
    )
    p.add_argument(
        "--max-timeout-requeues",
        type=_count_or_none,
        default=d("max_timeout_requeues"),
        help="requeues at the job's time limit allowed, counted apart from --max-requeues (a signal "
        "in the last 10 minutes or 20%% of the limit is the limit's; submitit's max_num_timeout); "
        "default: counted with the others",
    )
    p.add_argument(
        "--preempt-signal",
        default=d("preempt_signal"),
        help=f"signal that means 'save and requeue' (default {d('preempt_signal')}; USR1 is refused: "
        "NCCL may use it)",
    )
    observability_cli.add_run_arguments(p, d)
    _add_capacity_options(p)
    p.add_argument(
        "--repair-after",
        type=float,
        default=None,
        metavar="S",
        help="local runs: a drained simulated node comes back healthy S seconds later and refills the "
        "spares (on Slurm, a node resumed by an admin or the health hooks does); default: never",
    )
    ckpt_cli.add_run_arguments(p)
    elastic_cli.add_run_arguments(p)
    # Each option also reads SRES_<NAME> (srun --auto-resume passes no sres options; sbatch scripts export these).
    for action in p._actions:  # noqa: SLF001 - argparse keeps no public list
        name = next((o for o in action.option_strings if o.startswith("--")), None)
        value = os.environ.get(environment.variable(name)) if name else None
        if value is None or action.dest in ("help", "inject"):
            continue
        p.set_defaults(**{action.dest: value.lower() in ("1", "true", "yes") if action.nargs == 0 else value})


def _add_doctor_command(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: Slurm, backend, torch, /dev/shm, SPANK plugin",
        description="Report what this machine has for resilient training and how to fix what is missing. "
        "Exits 1 when something needed is missing.",
    )
    p.add_argument(
        "--slurm",
        action="store_true",
        help="treat Slurm as needed (it is by default only inside an allocation)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "cli", "pyslurm"],
        default="auto",
        help="Slurm client backend (default: pyslurm if it matches the cluster, else cli)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per Slurm command (default 10)")
    p.set_defaults(func=_cmd_doctor)


def _add_run_command(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a training command on N nodes (simulated, or the Slurm job's) with in-process recovery",
        description="Start N nodes x P ranks plus S warm spare nodes; the supervisor hosts the coordination store, "
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
        "--launcher",
        choices=["auto", "local", "slurm"],
        default="auto",
        help="where ranks run: simulated nodes on this machine, or srun steps of the Slurm job "
        "(default: slurm inside an allocation, else local)",
    )
    p.add_argument(
        "--srun-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --launcher slurm: an option for every rank's srun step (repeatable), e.g. --gpus-per-task=1",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=_run_default("max_restarts"),
        help=f"give up after this many faults (default {_run_default('max_restarts')})",
    )
    _add_supervision_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...: the training command")
    p.set_defaults(func=_cmd_run)


def _add_srun_command(sub) -> None:
    p = sub.add_parser(
        "srun",
        help="srun with auto-resume, inside an allocation: what 'srun --auto-resume=N' runs",
        description="Run srun's command as ranks supervised by sres inside the current Slurm allocation: on a fault "
        "the bad node is drained ('sres: <what was seen>'), its ranks move to a spare node of the "
        "allocation or to a node the job grows into, survivors keep their state in memory, and when "
        "no node is left the job requeues itself. Spare nodes default to the allocation's nodes beyond -N. "
        "Example (in an sbatch -N 4 script): sres srun --auto-resume=3 -N 3 python train.py",
        usage="sres srun [--auto-resume[=N]] [--spares S] [srun options] COMMAND...",
    )
    _add_supervision_options(p)
    p.add_argument(
        "srun_args",
        nargs=argparse.REMAINDER,
        help="--auto-resume=N (faults to recover from, default 1), --spares S, srun options, the command",
    )
    p.set_defaults(func=_cmd_srun)


def _add_template_command(sub) -> None:
    p = sub.add_parser(
        "template",
        help="print a ready sbatch script (auto-resume, spares, requeue, preemption)",
        description="Print one of the sbatch templates with its variables filled in; without NAME, "
        "list them. Example: sres template train.sbatch --set nodes=8 --set spares=1 "
        "--set command='python train.py' > job.sbatch",
    )
    p.add_argument("name", nargs="?", help="template name (train, train_no_plugin, multi_node_gpu)")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a variable's value (repeatable)"
    )
    p.add_argument("--show-variables", action="store_true", help="list the template's variables and defaults")
    p.set_defaults(func=_cmd_template)


def _add_demo_command(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="kill a node mid-training, recover from peers, compare with a fault-free run",
        description="Train a ~64 MiB MLP on 4 simulated nodes + 1 warm spare twice, without and with "
        "a node killed mid-run; print both final losses, whether the final state is bitwise "
        "identical, the recovery time and goodput.",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--width", type=int, default=1024, help="MLP width: 1024 gives ~64 MiB of state per rank")
    p.add_argument(
        "--log-dir", default="sres-runs", help="parent folder of the demo's logs (default sres-runs)"
    )
    p.set_defaults(func=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sres", description="Fault-tolerant PyTorch training on Slurm (slurm-resilience)."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done, to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_doctor_command(sub)
    _add_run_command(sub)
    _add_srun_command(sub)
    _add_template_command(sub)
    _add_demo_command(sub)
    from slurm_plugins.cli import add_parser as add_hooks_parser

    add_hooks_parser(sub)
    ckpt_cli.add_parser(sub)
    elastic_cli.add_parsers(sub)
    simulate_cli.add_parser(sub)
    chaos_cli.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except SresError as err:
        print(f"sres: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run(argv: Sequence[str] | None = None) -> int:
    """:func:`main` for a program that embeds sres: a user's error raises :class:`SresError`."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "srun":
        # srun's options and ours may interleave before the command: argparse cannot split them.
        from launcher.slurm.srun_args import split_ours

        options = argparse.ArgumentParser()
        _add_supervision_options(options)
        ours = {o: a.nargs != 0 for a in options._actions for o in a.option_strings}  # noqa: SLF001
        mine, theirs = split_ours(argv[1:], ours)
        argv = ["srun", *mine, "--", *theirs]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="sres: %(message)s")
    return int(args.func(args))
