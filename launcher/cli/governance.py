"""``sres governance apply POLICY [--dry-run]`` (a team and priority-class policy into Slurm's
accounting) and ``sres governance report`` (who used what): a contract, code outside the project
calls them.

Applying runs only the ``sacctmgr`` commands that change something, so a second apply prints
"nothing to change"; ``--dry-run`` prints every command and slurm.conf line and changes nothing.
slurm.conf is the admin's file: the lines the policy needs and the running controller lacks are
printed, never written (PreemptType and PriorityType then need slurmctld restarted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.errors import ConfigError
from launcher.governance import apply as governance_apply
from launcher.governance import report as governance_report
from launcher.governance import policy as governance_policy
from launcher.slurm.accounting import Accounting
from launcher.slurm.client import SlurmClient
from launcher.slurm.command_driver import CommandLine


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "governance",
        help="team quotas, borrowing and priority classes in Slurm's accounting",
        description="Turn a governance policy (YAML: teams, priority_classes) into Slurm accounts, "
        "QOS and slurm.conf lines (docs/admin/governance.md).",
    )
    actions = p.add_subparsers(dest="governance_command", metavar="ACTION", required=True)
    a = actions.add_parser("apply", help="make Slurm's accounting hold the policy; only what differs changes")
    a.add_argument("policy", type=Path, help="the policy file (YAML)")
    a.add_argument(
        "--dry-run",
        action="store_true",
        help="print every sacctmgr command and slurm.conf line; change nothing",
    )
    a.add_argument("--timeout", type=float, default=30.0, help="seconds for each Slurm command (default 30)")
    a.set_defaults(func=_cmd_apply)
    add_report_parser(actions)


def _cmd_apply(args: argparse.Namespace) -> int:
    policy = governance_policy.load(args.policy)
    client = SlurmClient.create("cli", timeout_s=args.timeout)
    accounting = Accounting(CommandLine(timeout_s=args.timeout))
    out = governance_apply.apply(policy, client, accounting, dry_run=args.dry_run, say=print)
    if not out.changes:
        print(f"cluster {out.cluster}: nothing to change; the accounting database holds this policy")
    elif args.dry_run:
        print(f"cluster {out.cluster}: {len(out.changes)} changes (dry run: nothing changed)")
        for change in out.changes:
            print(change.shell())
    else:
        print(f"cluster {out.cluster}: applied {len(out.changes)} changes")
    _print_conf(out.conf_gaps, args.dry_run)
    return 0


def _print_conf(gaps: tuple[tuple[str, str, str], ...], dry_run: bool) -> None:
    if not gaps:
        print("slurm.conf: the running controller has every setting the policy needs")
        return
    stream = sys.stdout if dry_run else sys.stderr
    print(
        "slurm.conf needs these lines; then restart slurmctld (reconfigure does not apply them):", file=stream
    )
    for key, want, have in gaps:
        print(f"{key}={want}    # running: {have}", file=stream)


def add_report_parser(actions: argparse._SubParsersAction) -> None:
    r = actions.add_parser("report", help="who used what: an HTML page with plots, a table, or JSON")
    r.add_argument("--hours", type=float, default=24.0, help="the window, ending now (default 24)")
    r.add_argument(
        "--out",
        type=Path,
        default=Path("governance-report.html"),
        help="the page (default ./governance-report.html)",
    )
    r.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    r.add_argument("--timeout", type=float, default=30.0, help="seconds for each Slurm command (default 30)")
    r.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    if args.hours <= 0:
        raise ConfigError("--hours must be positive")
    client = SlurmClient.create("cli", timeout_s=args.timeout)
    u = governance_report.gather(client, Accounting(CommandLine(timeout_s=args.timeout)), args.hours)
    page = governance_report.render(u, args.out)
    if args.json:
        print(governance_report.as_json(u))
    else:
        print(governance_report.table(u))
        print(f"page: {page}")
    return 0
