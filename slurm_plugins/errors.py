"""Errors of what admins install: the hooks, their checks and configuration, the installer, the
SPANK plugin's build.

One base under the launcher's :class:`SresError` (``sres hooks ...`` is a subcommand of
``sres``, which prints any ``SresError`` as one line): every error an admin or a node can cause
here is defined in this module and is a :class:`HooksError`. A failed *check* is not an
error: it is a ``CheckResult`` the hook logs and acts on.
"""

from __future__ import annotations

from launcher.errors import ConfigError, SresError


class HooksError(SresError):
    """Something the admins' side of slurm-resilience refused or could not do."""


class HooksConfigError(HooksError, ConfigError):
    """Bad arguments or files given to ``sres hooks ...``, refused before anything is done."""


class HealthConfigError(HooksConfigError):
    """The health config is unreadable or invalid; ``key`` names the offending key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        where = f"{key}: " if key else ""
        super().__init__(f"health config {source}: {where}{problem}")


class InstallError(HooksError):
    """One node's installation failed; the message is the report's one line."""


class SpankBuildError(HooksError):
    """The SPANK plugin did not compile; the message carries the compiler's output."""
