"""``sres hooks ...``: the admin's commands, registered into ``sres`` by :func:`add_parser`."""

from __future__ import annotations

import argparse
import json
import os


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
        description="Health checks that keep jobs off sick nodes: Slurm's Prolog, Epilog and HealthCheckProgram, "
        "local check runs, and installation on nodes over SSH.",
    )
    sub = hooks.add_subparsers(dest="hooks_command", metavar="HOOK", required=True)
    config_help = "health config (default: $SRES_HEALTH_CONFIG, else /etc/sres/health.yaml)"
    for name, what in (
        ("prolog", "Slurm Prolog: check before a job starts; exit 1 keeps the job off this node"),
        ("epilog", "Slurm Epilog: clean the job's processes and RAM tier, then check"),
        ("health", "Slurm HealthCheckProgram: drain on failure, resume our own drains when healthy"),
    ):
        p = sub.add_parser(name, help=what, description=what)
        p.add_argument("--config", help=config_help)
        p.add_argument("--verify", action="store_true", help="only load and validate the config, then exit")
        p.set_defaults(func=_cmd_hook, hook="health" if name == "health" else name)
    for name, deep in (("check", False), ("deep-check", True)):
        what = (
            "run every check here and print a table (acts on nothing)"
            if not deep
            else "run the deep checks here (GPU stress, all-reduce bandwidth, memory, disk); JSON"
        )
        p = sub.add_parser(name, help=what, description=what + ". Exits 1 when a check fails.")
        p.add_argument("--config", help=config_help)
        p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
        p.set_defaults(func=_cmd_check, deep=deep)
    p = sub.add_parser(
        "install",
        help="copy hook wrappers and config to nodes over SSH, verify, print slurm.conf lines",
        description="For each node: upload the wrappers and config next to the current ones, run them there to "
        "verify, then swap them in atomically (the previous version kept as *.prev). A node that fails "
        "is reported and left unchanged. Prints the slurm.conf (and plugstack.conf) lines; --apply "
        "writes them into the local slurm.conf, keeping a backup.",
    )
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
    p.add_argument("--spank", help="path of sres_auto_resume.so on the nodes, for the plugstack.conf line")
    p.add_argument("--apply", action="store_true", help="write the lines into --slurm-conf (backup kept)")
    p.add_argument(
        "--slurm-conf", help="slurm.conf for --apply (default: $SLURM_CONF, else /etc/slurm/slurm.conf)"
    )
    p.add_argument("--timeout", type=float, default=20.0, help="seconds for each SSH connect and command")
    p.set_defaults(func=_cmd_install)
    from slurm_plugins.spank import build as spank_build

    spank_build.add_parser(sub)
