"""argparse for ``sres``, with a usage error as one line that points to ``--help``.

argparse's own ``error`` prints the whole usage first (30 lines for ``sres run``), which buries
the one line that says what was wrong. Torch-free: ``sres hooks`` (slurm_plugins.cli) uses it too.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose subcommands are ``Parser`` too (``add_subparsers`` takes the
    class of its parent)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
