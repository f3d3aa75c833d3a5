"""``sres template [NAME]``: print a ready sbatch script with its variables filled in, or list them."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "template",
        help="print a ready sbatch script (auto-resume, spares, requeue, preemption)",
        description="Print one of the sbatch templates with its variables filled in; without NAME, "
        "list them. Example: sres template train.sbatch --set nodes=8 --set spares=1 "
        "--set command='python train.py' > job.sbatch",
    )
    p.add_argument("name", nargs="?", help="template name (without NAME: the list)")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a variable's value (repeatable)"
    )
    p.add_argument("--show-variables", action="store_true", help="list the template's variables and defaults")
    p.set_defaults(func=_cmd_template)


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
