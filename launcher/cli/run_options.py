"""The options ``sres run`` and ``sres srun`` share, which say how a run is supervised, and their
reading into a ``RunOptions`` (``launcher.run.request``).

Each option's default is ``RunOptions``'s (the command line repeats none), and each also reads
``SRES_<OPTION>`` through the one table, ``launcher.run.environment`` (``srun --auto-resume``
passes no sres options; sbatch scripts export these).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from launcher.cli.arg_types import finite_float
from launcher.cli import ckpt as ckpt_cli
from launcher.cli import elastic as elastic_cli
from launcher.cli import observability_options as observability_cli
from launcher.run import environment
from launcher.run.request import RunOptions
from launcher.slurm.satellites import GROW_BY
from resilience.contract import injections


def default(name: str) -> Any:
    """``RunOptions``' default for an option, by its Python name."""
    return RunOptions.__dataclass_fields__[name].default


def count_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a count, or 'none'") from None


class _Inject(argparse.Action):
    """``--inject SPEC``, repeatable; ``--inject help`` (or ``-h``/``--help`` after it) lists
    every fault kind from its registry and exits."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values in HELP_WORDS:
            print(injections.kinds_help())  # to stdout, as --help
            parser.exit()
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


HELP_WORDS = ("help", "-h", "--help")


def inject_help_alias(argv: list[str]) -> list[str]:
    """``--inject --help`` as ``--inject help``: argparse would take ``--help`` for the command's
    own and say ``--inject`` expected an argument, where the user asked what it takes."""
    return [
        "help" if word in HELP_WORDS[1:] and i and argv[i - 1] == "--inject" else word
        for i, word in enumerate(argv)
    ]


def options_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RunOptions:
    """The parsed options as ``RunOptions``; faults to inject from ``SRES_INJECT`` when the command
    line gives none (a list the command line replaces, so argparse cannot take it as a default)."""
    values = {f.name: getattr(args, f.name) for f in fields(RunOptions)}
    values["inject"] = args.inject or environment.values(environ).get("inject", [])
    return RunOptions(**values)


def add_supervision_options(p: argparse.ArgumentParser) -> None:
    """Every option of ``RunOptions``, in the order ``--help`` shows them, with their ``SRES_*`` defaults."""
    _add_fault_options(p)
    _add_recovery_options(p)
    _add_copy_options(p)
    _add_requeue_options(p)
    observability_cli.add_run_arguments(p, default)
    _add_capacity_options(p)
    p.add_argument(
        "--repair-after",
        type=finite_float,
        default=None,
        metavar="S",
        help="local runs: a drained simulated node comes back healthy S seconds later and refills the "
        "spares (on Slurm, a node resumed by an admin or the health hooks does); default: never",
    )
    ckpt_cli.add_run_arguments(p)
    elastic_cli.add_run_arguments(p)
    p.set_defaults(**environment.defaults(os.environ))  # text: argparse reads it as the option's type


def _add_fault_options(p: argparse.ArgumentParser) -> None:
    """Faults to inject, and where the run's logs go."""
    p.add_argument(
        "--inject",
        action=_Inject,
        default=[],
        metavar="SPEC",
        help="fault to inject (repeatable), e.g. kill:rank=R:step=S or node:N:step=S; "
        f"kinds: {', '.join(injections.KINDS)}, or random:...; "
        "'--inject help' says each one's spec and effect; also SRES_INJECT='SPEC;SPEC'",
    )
    p.add_argument(
        "--log-dir",
        help="where events.jsonl and rank logs go (default $SRES_LOG_DIR, else "
        "sres-runs/job-<id> in a Slurm job, else sres-runs/run-<time>)",
    )


def _add_recovery_options(p: argparse.ArgumentParser) -> None:
    """How ranks are watched and recovered."""
    d = default
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
        "--no-fork-server",
        action="store_true",
        help="start every rank process cold (Python, torch and the script's imports on the recovery path) "
        "instead of forking it from its machine's fork server, which imports the script once "
        "(docs/guide/fork-server.md says what a script must not start before resilience.run)",
    )
    p.add_argument(
        "--backend", choices=["gloo", "nccl"], default=d("backend"), help="torch.distributed backend"
    )
    p.add_argument(
        "--hang-timeout",
        type=finite_float,
        default=d("hang_timeout"),
        help=f"seconds without heartbeat before a rank is declared hung (default {d('hang_timeout'):g})",
    )
    p.add_argument(
        "--reform-timeout",
        type=finite_float,
        default=d("reform_timeout"),
        help=f"seconds to wait for every rank of a new generation (default {d('reform_timeout'):g})",
    )
    p.add_argument(
        "--node-fault-after",
        type=int,
        default=d("node_fault_after"),
        help=f"process faults on one node after which the node is drained and replaced "
        f"(default {d('node_fault_after')})",
    )


def _add_copy_options(p: argparse.ArgumentParser) -> None:
    """How sharded state is copied to buddies after each commit."""
    d = default
    p.add_argument(
        "--replication-factor",
        type=int,
        default=d("replication_factor"),
        help=f"copies of each sharded state shard (default {d('replication_factor')})",
    )
    p.add_argument(
        "--copy-pace",
        type=finite_float,
        default=d("copy_pace"),
        metavar="SHARE",
        help="share of the recent step time each buddy copy is spread over, so that it leaves while "
        f"the host idles and ends within the step (default {d('copy_pace'):g}; 0: sent at once)",
    )


def _add_requeue_options(p: argparse.ArgumentParser) -> None:
    """When a Slurm batch job requeues itself, and on which signal."""
    d = default
    p.add_argument(
        "--max-requeues",
        type=count_or_none,
        default=d("max_requeues"),
        help=f"in a Slurm batch job: requeue at most this many times (SLURM_RESTART_COUNT; "
        f"'none': no cap of ours, Slurm's MaxBatchRequeue still applies; default {d('max_requeues')})",
    )
    p.add_argument(
        "--max-timeout-requeues",
        type=count_or_none,
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
