"""Errors of the code inside a rank. One base, so that callers can tell ours from the rest.

Each says in one line what happened and what to do; it crosses to the supervisor as a
structured report (``resilience.contract.messages.Report``), never as parsed text.
"""

from __future__ import annotations


class ResilienceError(Exception):
    """Something the rank side of slurm-resilience refused or could not do."""


class OptionError(ResilienceError, TypeError):
    """``resilience.run(train, **options)`` got an option it does not know, or a bad value."""


class RankEnvError(ResilienceError, ValueError):
    """The environment the supervisor gave this rank is incomplete or malformed."""


class RegistrationError(ResilienceError, TypeError):
    """``ctx.register`` got an object whose state sres cannot protect or bring back as it was."""
