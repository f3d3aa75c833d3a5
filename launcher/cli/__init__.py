"""``sres``, one module per subcommand: each parses its options, builds a request, prints the outcome.

``parser`` assembles the subcommands and holds :func:`main` (one line for a user's error, a
traceback only for our bugs) and :func:`run` (the same for a program that embeds sres).
``python -m launcher.cli`` is ``sres`` without the requeue-signal latch of ``launcher.entry``.
"""

from launcher.cli.parser import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
