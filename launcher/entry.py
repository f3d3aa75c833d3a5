"""The ``sres`` command: latch the requeue signal, then load the CLI (which imports torch).

``sres hooks ...`` (Slurm's prolog, epilog and health check on every node, for every job) goes
to ``slurm_plugins.cli`` alone, which imports no torch."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["hooks"]:
        from slurm_plugins import cli as hooks_cli

        return hooks_cli.main(sys.argv[1:])
    from launcher.run import signal_latch

    if sys.argv[1:2] in (["run"], ["srun"]):
        signal_latch.latch(sys.argv[2:])
    from launcher import cli

    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
