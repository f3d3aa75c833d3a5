"""A site's own check: any program (``ibstat``, a vendor tool) that exits 0 when all is well.

This is how admins add what we do not ship without editing our code; the runner's budget
applies to it like to any other check, so a program that hangs is killed.
"""

from __future__ import annotations

import subprocess

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok
from slurm_plugins.health_config import CommandCheck


def command_check(spec: CommandCheck):
    """The check function for one configured command."""

    def run(ctx: CheckContext) -> list[CheckResult]:
        argv = [ctx.expand(a) for a in spec.command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        except OSError as err:
            return [fail(spec.name, f"cannot run {argv[0]}: {err.strerror or err}", Fault(spec.fault))]
        if done.returncode == 0:
            return [ok(spec.name, (done.stdout.strip().splitlines() or [""])[-1][:200])]
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()
        detail = f"exit {done.returncode}" + (f": {last[-1][:200]}" if last else "")
        return [fail(spec.name, detail, Fault(spec.fault))]

    return run
