"""Hold the requeue signal from the job process's first moment until the supervisor takes it.

Slurm may send ``--signal=B:USR2@T`` at once when the time limit is near (a short job, or a
requeued one), while the process is still importing torch: USR2's default action would end
the job and lose the requeue. The entry points call :func:`latch` before any heavy import;
the supervisor asks :func:`caught` when it installs its own handler. The signal's name comes
from where the CLI will read it: ``--preempt-signal``, else ``SRES_PREEMPT_SIGNAL`` (sbatch
scripts export it; ``srun --auto-resume`` passes no sres option), else the default. Standard
library only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence

from launcher.run import environment

DEFAULT_SIGNAL = "USR2"
"""``--preempt-signal``'s default (RunConfig's; a unit test keeps the two equal)."""

_caught: list[str] = []


def signal_name(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> str:
    """The requeue signal as ``SIGUSR2``: ``--preempt-signal`` in ``argv`` wins over
    ``SRES_PREEMPT_SIGNAL`` in ``environ``; without either, the default."""
    name = environment.option_value("--preempt-signal", argv, environ)
    name = (DEFAULT_SIGNAL if name is None else name).upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def latch(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Catch the requeue signal the run will use (once); an unknown name is left to the CLI to refuse."""
    number = getattr(signal, signal_name(argv, environ), None)
    if isinstance(number, signal.Signals):
        signal.signal(number, lambda signum, _frame: _caught.append(signal.Signals(signum).name))


def caught() -> str | None:
    """The name of the signal caught before the supervisor took over, if any."""
    return _caught[0] if _caught else None
