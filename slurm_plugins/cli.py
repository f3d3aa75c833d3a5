"""``sres hooks ...``: the admin's commands, registered into ``sres`` by :func:`add_parser`.

Slurm runs ``sres hooks prolog|epilog|health`` on every node for every job, so the ``sres``
console script (``launcher.entry``) hands ``sres hooks ...`` to :func:`main` here without
loading the rest of ``sres`` (which imports torch): nothing under ``slurm_plugins`` imports
torch at module level (``tests/unit/test_layout.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from launcher.arg_parser import Parser
from launcher.errors import SresError

CONFIG_HELP = "health config (default: $SRES_HEALTH_CONFIG, else /etc/sres/health.yaml)"
HOOK_COMMANDS = (
    ("prolog", "Slurm Prolog: check before a job starts; exit 1 keeps the job off this node"),
    ("epilog", "Slurm Epilog: clean the job's processes and RAM tier, then check"),
    ("health", "Slurm HealthCheckProgram: drain on failure, resume our own drains when healthy"),
)


def _cmd_hook(args: argparse.Namespace) -> int:
    from slurm_plugins.hooks import run_hook

    return run_hook(args.hook, args.config, os.environ, verify=args.verify)


def _cmd_check(args: argparse.Namespace) -> int:
    from slurm_plugins.hooks import render, run_local

    results = run_local(args.config, os.environ, deep=args.deep)
    if args.json or args.deep:
        print(json.dumps([r.to_json() for r in results], indent=None if args.json else 1))
    else:
        print(render(results))
    return 1 if any(r.failed for r in results) else 0


def _cmd_install(args: argparse.Namespace) -> int:
    from slurm_plugins.install import main

    return main(args)


def add_parser(subparsers) -> None:
    """Add ``hooks`` and its subcommands to ``sres``'s subparsers."""
    hooks = subparsers.add_parser(
        "hooks",
        help="node health hooks for admins: prolog, epilog, health check, install",
        description="Health checks that keep jobs off sick nodes: Slurm's Prolog, Epilog and "
        "HealthCheckProgram, local check runs, and installation on nodes over SSH.",
    )
    sub = hooks.add_subparsers(dest="hooks_command", metavar="HOOK", required=True)
    _add_hook_commands(sub)
    _add_check_commands(sub)
    _add_install_command(sub)
    from slurm_plugins.spank import build as spank_build

    spank_build.add_parser(sub)


def _add_hook_commands(sub) -> None:
    """``prolog``, ``epilog``, ``health``: what slurm.conf runs (through the wrappers)."""
    for name, what in HOOK_COMMANDS:
        p = sub.add_parser(name, help=what, description=what)
        p.add_argument("--config", help=CONFIG_HELP)
        p.add_argument("--verify", action="store_true", help="only load and validate the config, then exit")
        p.set_defaults(func=_cmd_hook, hook=name)


def _add_check_commands(sub) -> None:
    """``check`` and ``deep-check``: an admin's look at this node, acting on nothing."""
    for name, deep in (("check", False), ("deep-check", True)):
        what = (
            "run every check here and print a table (acts on nothing)"
            if not deep
            else "run the deep checks here (GPU stress, all-reduce bandwidth, memory, disk); JSON"
        )
        p = sub.add_parser(name, help=what, description=what + ". Exits 1 when a check fails.")
        p.add_argument("--config", help=CONFIG_HELP)
        p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
        p.set_defaults(func=_cmd_check, deep=deep)


def _add_install_command(sub) -> None:
    p = sub.add_parser(
        "install",
        help="copy hook wrappers and config to nodes over SSH, verify, print slurm.conf lines",
        description="For each node: upload the wrappers and config next to the current ones, run them "
        "there to verify, then swap them in atomically (the previous version kept as *.prev). A node "
        "that fails is reported and left unchanged. Prints the slurm.conf (and plugstack.conf) lines; "
        "--apply writes them into the local slurm.conf, keeping a backup.",
    )
    _add_ssh_options(p)
    p.add_argument(
        "--prefix",
        default="/etc/sres",
        help="install directory on each node; %%n becomes the node name (default /etc/sres)",
    )
    p.add_argument("--config", help="health config to ship (default: the built-in defaults)")
    p.add_argument("--sres", default="sres", help="how the nodes run sres (default: sres)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="exported by the wrappers (repeatable), e.g. SLURM_CONF=/etc/slurm/slurm.conf",
    )
    p.add_argument("--interval", type=int, default=300, help="HealthCheckInterval seconds (default 300)")
    p.add_argument(
        "--spank",
        help="sres_auto_resume.so built here (sres hooks build-spank): copied to the nodes, named in "
        "plugstack.conf",
    )
    p.add_argument("--apply", action="store_true", help="write the lines into --slurm-conf (backup kept)")
    p.add_argument(
        "--slurm-conf", help="slurm.conf for --apply (default: $SLURM_CONF, else /etc/slurm/slurm.conf)"
    )
    p.set_defaults(func=_cmd_install)


def _add_ssh_options(p: argparse.ArgumentParser) -> None:
    """Which nodes ``install`` reaches, and how."""
    p.add_argument("--nodes", required=True, help="hostlist of nodes, e.g. gpu[01-16]")
    p.add_argument("--ssh-user", default="root", help="SSH user (default root)")
    p.add_argument("--key", help="private key file (default: ssh agent and ~/.ssh keys)")
    p.add_argument("--port", type=int, default=22, help="SSH port (default 22)")
    p.add_argument("--known-hosts", help="known_hosts file to trust besides ~/.ssh/known_hosts")
    p.add_argument(
        "--accept-unknown-hosts",
        action="store_true",
        help="trust host keys not in known_hosts (first install on new nodes)",
    )
    p.add_argument("--timeout", type=float, default=20.0, help="seconds for each SSH connect and command")


def main(argv: Sequence[str] | None = None) -> int:
    """``sres hooks ...`` on its own (``argv`` starts with ``hooks``): what ``sres`` does with
    it, without loading ``sres``'s other commands. A user's error is one line, exit 1."""
    parser = Parser(prog="sres")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="sres: %(message)s")
    try:
        return int(args.func(args))
    except SresError as err:
        print(f"sres: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
