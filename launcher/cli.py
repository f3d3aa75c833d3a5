"""``sres``: the one command-line entry point (Slurm RESilience).

Errors a user can cause (:class:`SresError`) print one line and exit 1; usage errors exit 2
(argparse). Anything else is our bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launcher import ckpt_cli, doctor
from launcher.errors import ConfigError, SresError
from launcher.slurm import SlurmClient


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
    from launcher.supervisor import RunConfig, Supervisor
    from resilience import faults

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        # --inject on the command line wins; SRES_INJECT serves under sbatch.
        injections = faults.parse(args.inject) if args.inject else faults.parse_env(os.environ.get("SRES_INJECT"))
    except faults.InjectSpecError as err:
        raise ConfigError(str(err)) from None
    log_dir = Path(args.log_dir or _default_log_dir())
    config = RunConfig(
        command=tuple(command), nodes=args.nodes, procs_per_node=args.procs_per_node, spares=args.spares,
        injections=injections, log_dir=log_dir, backend=args.backend,
        hang_timeout_s=args.hang_timeout, reform_timeout_s=args.reform_timeout, max_restarts=args.max_restarts,
        replication_factor=args.replication_factor, tiers=ckpt_cli.tier_config(args, log_dir),
    )
    print(f"sres: {config.nodes} node(s) x {config.procs_per_node} rank(s), {config.spares} spare node(s); "
          f"log dir {config.log_dir}", file=sys.stderr)
    outcome = Supervisor(config).run()
    return 0 if outcome.ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from launcher.demo import DemoConfig, main

    return main(DemoConfig(steps=args.steps, width=args.width, log_dir=Path(args.log_dir)))


def _default_log_dir() -> str:
    return time.strftime("sres-runs/run-%Y%m%d-%H%M%S")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sres", description="Fault-tolerant PyTorch training on Slurm (slurm-resilience)."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done, to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("doctor", help="check this machine: Slurm, backend, torch, /dev/shm, SPANK plugin",
                       description="Report what this machine has for resilient training and how to fix what is missing. "
                                   "Exits 1 when something needed is missing.")
    p.add_argument("--slurm", action="store_true",
                   help="treat Slurm as needed (it is by default only inside an allocation)")
    p.add_argument("--backend", choices=["auto", "cli", "pyslurm"], default="auto",
                   help="Slurm client backend (default: pyslurm if it matches the cluster, else cli)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per Slurm command (default 10)")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser(
        "run", help="run a training command on N simulated nodes with in-process recovery",
        description="Start N simulated nodes on this machine (P ranks each) plus S warm spare nodes; the supervisor "
                    "hosts the coordination store, watches every rank and recovers from faults in-process. "
                    "Example: sres run --nodes 4 --spares 1 -- python -m resilience.examples.train_mlp")
    p.add_argument("--nodes", type=int, required=True, help="number of (simulated) nodes")
    p.add_argument("--procs-per-node", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument("--spares", type=int, default=0,
                   help="warm spare nodes: processes started and waiting, torch imported, to take a lost node's ranks")
    p.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="fault to inject (repeatable): kill|raise|hang|kill-during-commit:rank=R:step=S or node:N:step=S; "
                        "also SRES_INJECT='SPEC;SPEC'")
    p.add_argument("--log-dir", help="where events.jsonl and rank logs go (default sres-runs/run-<time>)")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="torch.distributed backend")
    p.add_argument("--hang-timeout", type=float, default=30.0, help="seconds without heartbeat before a rank is declared hung (default 30)")
    p.add_argument("--reform-timeout", type=float, default=60.0, help="seconds to wait for every rank of a new generation (default 60)")
    p.add_argument("--max-restarts", type=int, default=10, help="give up after this many faults (default 10)")
    p.add_argument("--replication-factor", type=int, default=2, help="copies of each sharded state shard (default 2)")
    ckpt_cli.add_run_arguments(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...: the training command")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("demo", help="kill a node mid-training, recover from peers, compare with a fault-free run",
                       description="Train a ~64 MiB MLP on 4 simulated nodes + 1 warm spare twice, without and with "
                                   "a node killed mid-run; print both final losses, whether the final state is bitwise "
                                   "identical, the recovery time and goodput.")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--width", type=int, default=1024, help="MLP width: 1024 gives ~64 MiB of state per rank")
    p.add_argument("--log-dir", default="sres-runs", help="parent folder of the demo's logs (default sres-runs)")
    p.set_defaults(func=_cmd_demo)
    ckpt_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="sres: %(message)s")
    try:
        return int(args.func(args))
    except SresError as err:
        print(f"sres: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
