"""Errors of the code inside a rank. One base, so that callers can tell ours from the rest.

Each says in one line what happened and what to do; it crosses to the supervisor as a
structured report (``resilience.contract.messages.Report``), never as parsed text.

Every error a user (or the run's circumstances) can cause on the rank side is defined here and
nowhere else; the module that raises one imports it, and a name users import from its old
place (``resilience.Unrecoverable``, ``resilience.tiers.manifest.CheckpointInvalid``) still
works. Standard library only: ``resilience.contract`` and the admins' hooks import it, and
neither may pull in torch (``tests/unit/test_layout.py`` holds both rules).
"""

from __future__ import annotations


class ResilienceError(Exception):
    """Something the rank side of slurm-resilience refused or could not do."""


# --- what a user gave --------------------------------------------------------------------------


class OptionError(ResilienceError, TypeError):
    """``resilience.run(train, **options)`` got an option it does not know, or a bad value."""


class RankEnvError(ResilienceError, ValueError):
    """The environment the supervisor gave this rank is incomplete or malformed."""


class RegistrationError(ResilienceError, TypeError):
    """``ctx.register`` got an object whose state sres cannot protect or bring back as it was."""


class CommitOrderError(ResilienceError, RuntimeError):
    """A hook-driven loop (an integration) began a step or left ``train`` with a commit still open,
    closed one it never opened, or began a step that does not follow the last commit: the same on
    every entry, so the run stops at once rather than retrying."""


class NotPlainData(RegistrationError):
    """A registered state holds a value a commit cannot write as data (see
    :mod:`resilience.state.skeleton`); the message gives the path to it, filled in on the way
    out of the walk."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value, self.path = value, ""

    def __str__(self) -> str:
        kind = f"{type(self.value).__module__}.{type(self.value).__qualname__}"
        return (
            f"registered state{self.path} is a {kind}: a commit keeps tensors and plain data only "
            "(dict, list, tuple, str, int, float, bool, None); store it as one (.item(), .tolist(), "
            "str(), a dict)"
        )


class TierConfigError(ResilienceError, ValueError):
    """A tier configuration that cannot work; the message says which setting."""


class ElasticConfigError(ResilienceError, ValueError):
    """An elastic setting that cannot work; the message names the key."""


class InjectSpecError(ResilienceError, ValueError):
    """An ``--inject`` spec that cannot be parsed; the message names the spec."""


class SettingsUnreadable(ResilienceError, ValueError):
    """A settings file that cannot be read as YAML data (:mod:`resilience.contract.settings_yaml`),
    said in one line."""


class ForgedValue(ResilienceError, ValueError):
    """A store value without the run's MAC: written by someone who does not know the run's
    secret (``resilience.contract.signed_store``). Read as absent, reported, never trusted."""


class NotPrivate(ResilienceError, PermissionError):
    """A path sres would keep a user's state in is not that user's alone (another user's, or a
    link): ``resilience.private_paths``."""


# --- what training met ---------------------------------------------------------------------------


class BatchError(ResilienceError, ValueError):
    """The global batch cannot be kept at this world size and the policy says fail."""


class GradientNotRepresentable(ResilienceError, ArithmeticError):
    """A step's gradient holds inf/NaN, or spans more than the int64 sum holds."""


class InjectedFault(ResilienceError, RuntimeError):
    """The exception that ``raise:`` injects."""


# --- state that cannot be brought back -----------------------------------------------------------


class Unrecoverable(ResilienceError, RuntimeError):
    """Some rank's state exists on no live process: peers cannot restore it."""


class CheckpointError(ResilienceError, RuntimeError):
    """Base of the checkpoint errors."""


class CheckpointInvalid(CheckpointError):
    """A checkpoint that must not be used: missing or bad manifest, missing file, wrong size,
    checksum mismatch, another job or world size. The message names the file."""


class OtherJob(CheckpointInvalid):
    """A checkpoint of another job, in a directory jobs share: not this job's to use or judge."""


class CorruptBatch(ResilienceError, ValueError):
    """A cached batch file that is not whole: a checksum, its header or its format does not match
    (:mod:`resilience.data.batch_file`); its batch is made again, never trained on."""


class UnsupportedBatch(ResilienceError, TypeError):
    """A batch holding what a file of data cannot hold (an object only a pickle could)."""


class CacheTooSmall(ResilienceError, OSError):
    """The node's memory filesystem cannot hold the batches the cache must keep."""


class Fenced(ResilienceError, RuntimeError):
    """This process's lease from the supervisor ran out (it could not reach it for longer than the
    bound): a newer generation may already hold its rank, so it writes nothing more and ends."""


class ReadClosed(ResilienceError, RuntimeError):
    """A copy left behind tried to read live state after its generation ended: it stops
    (:mod:`resilience.agent.live_read`)."""
