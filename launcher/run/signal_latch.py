"""Hold the requeue signal from the job process's first moment until the supervisor takes it.

Slurm may send ``--signal=B:USR2@T`` at once when the time limit is near (a short job, or a
requeued one), while the process is still importing torch: USR2's default action would end
the job and lose the requeue. The entry points call :func:`latch` (or, for a job of
``ResilientExecutor``, :func:`latch_request`) before any heavy import; the supervisor asks
:func:`caught` when it installs its own handler. The signal's name comes from where the run
will read it: ``--preempt-signal``, else ``SRES_PREEMPT_SIGNAL`` (sbatch scripts export it;
``srun --auto-resume`` passes no sres option), else the default; or the ``RunRequest`` the job
was given. Standard library only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence

from launcher.run import environment, request

DEFAULT_SIGNAL = request.RunOptions.preempt_signal
"""``--preempt-signal``'s default: the request's own (whose defaults tests keep equal to RunConfig's)."""

_caught: list[str] = []


def signal_name(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> str:
    """The requeue signal as ``SIGUSR2``: ``--preempt-signal`` in ``argv`` wins over
    ``SRES_PREEMPT_SIGNAL`` in ``environ``; without either, the default."""
    return _full_name(environment.option_value("--preempt-signal", argv, environ))


def request_signal_name(text: str) -> str:
    """The requeue signal a ``RunRequest``'s JSON names (the environment's is in it already, read
    when the request was made); text that is no request: the default."""
    return _full_name(request.preempt_signal_in(text))


def latch(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Catch the requeue signal the run will use (once); an unknown name is left to the CLI to refuse."""
    _hold(signal_name(argv, environ))


def latch_request(text: str) -> None:
    """:func:`latch` for a process given a ``RunRequest`` as JSON."""
    _hold(request_signal_name(text))


def caught() -> str | None:
    """The name of the signal caught before the supervisor took over, if any."""
    return _caught[0] if _caught else None


def _full_name(name: str | None) -> str:
    name = (DEFAULT_SIGNAL if name is None else name).upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def _hold(name: str) -> None:
    number = getattr(signal, name, None)
    if isinstance(number, signal.Signals):
        signal.signal(number, lambda signum, _frame: _caught.append(signal.Signals(signum).name))
