"""Errors of the launcher. Each is expected, explained in one line, and shown without a traceback.

Anything that is not an ``SresError`` is a bug of ours, and ``sres`` lets its traceback through.
Every error a user or the cluster can cause is defined here; the module that raises one imports
it (``launcher.slurm.hostlist.HostlistError`` and ``launcher.supervisor.control.ControlError``
still name them). Standard library only: the Slurm client and the admins' hooks import it.
"""

from __future__ import annotations

from collections.abc import Sequence


class SresError(Exception):
    """An error a user or the cluster can cause; ``str()`` says what happened and what to do."""


class ConfigError(SresError):
    """Bad arguments or configuration, refused before anything starts."""


class HostlistError(SresError, ValueError):
    """A hostlist expression that Slurm would also refuse."""


class ControlError(SresError):
    """A control request (``sres resize/grow/shrink/status``) that could not be delivered or was refused."""


class Unreachable(ControlError):
    """No supervisor answers at this run's address from here (or no run is found here):
    ``--job`` then asks through a step of the job on its batch host."""


class PrivilegeError(SresError):
    """Work done as another user (root on a user's behalf, ``launcher.privileges``) failed."""


class SlurmError(SresError):
    """Slurm refused or could not do what we asked."""


class SlurmUnavailable(SlurmError):
    """Slurm's commands are missing or its controller does not answer."""


class NotInAllocation(SlurmError):
    """An operation that needs a Slurm job was called outside one."""


class ShrinkRefused(SlurmError):
    """Slurm would not drop nodes from a running job, and will not on a retry (22.05 without
    slurmdbd resizes a job's node list once)."""


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero or ran past its timeout.

    Carries the command, its exit code (``None`` after a timeout) and its whole stderr, so
    callers decide on data rather than on a parsed message; ``str()`` is one line.
    """

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        what = "timed out" if returncode is None else f"exited {returncode}"
        # Slurm tools print a chain of "error:" lines ending in the one that matters.
        last = self.stderr.splitlines()[-1].strip() if self.stderr else ""
        detail = f": {last}" if last else ""
        super().__init__(f"'{' '.join(self.argv)}' {what}{detail}")


class PolicyError(ConfigError):
    """A governance policy that cannot be applied as written (``sres governance``), refused before
    anything in Slurm's accounting changes."""


class ApplyFailed(SlurmError):
    """A governance policy's change that Slurm refused part way; what was done before it is undone."""
