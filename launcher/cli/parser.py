"""``sres``: the one command-line entry point (Slurm RESilience), assembled from one module per subcommand.

Errors a user can cause (:class:`SresError`) print one line and exit 1; usage errors print one
line that points to ``--help`` and exit 2 (:class:`launcher.arg_parser.Parser`). Anything else
is our bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from launcher.arg_parser import Parser
from launcher.cli import chaos as chaos_cli
from launcher.cli import ckpt as ckpt_cli
from launcher.cli import demo, doctor, run_command, run_options, template
from launcher.cli import elastic as elastic_cli
from launcher.cli import governance as governance_cli
from launcher.cli import jobs as jobs_cli
from launcher.cli import simulate as simulate_cli
from launcher.errors import SresError
from launcher.observability import report


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sres", description="Fault-tolerant PyTorch training on Slurm (slurm-resilience).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done, to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor.add_parser(sub)
    run_command.add_parsers(sub)  # run, srun
    template.add_parser(sub)
    demo.add_parser(sub)
    from slurm_plugins.cli import add_parser as add_hooks_parser

    add_hooks_parser(sub)
    ckpt_cli.add_parser(sub)
    elastic_cli.add_parsers(sub)
    simulate_cli.add_parser(sub)
    chaos_cli.add_parser(sub)
    report.add_parser(sub)
    governance_cli.add_parser(sub)
    jobs_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except SresError as err:
        print(f"sres: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.filename is None:
            raise  # not about a path the user gave: ours to fix, with its traceback
        # A path the user named that cannot be used (unreadable, a file for a directory, ...).
        print(f"sres: error: {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run(argv: Sequence[str] | None = None) -> int:
    """:func:`main` for a program that embeds sres: a user's error raises :class:`SresError`."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "srun":
        argv = ["srun", *run_command.split_srun_argv(argv[1:])]
    argv = run_options.inject_help_alias(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="sres: %(message)s")
    return int(args.func(args))
