"""The ``sres`` command: latch the requeue signal, then load the CLI (which imports torch)."""

from __future__ import annotations

import sys


def main() -> int:
    from launcher.run import signal_latch

    if sys.argv[1:2] in (["run"], ["srun"]):
        signal_latch.latch(sys.argv[2:])
    from launcher import cli

    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
