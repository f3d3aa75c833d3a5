"""Hold the requeue signal from the job process's first moment until the supervisor takes it.

Slurm may send ``--signal=B:USR2@T`` at once when the time limit is near (a short job, or a
requeued one), while the process is still importing torch: USR2's default action would end
the job and lose the requeue. The entry points call :func:`latch` before any heavy import;
the supervisor asks :func:`caught` when it installs its own handler. Standard library only.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

DEFAULT_SIGNAL = "USR2"
"""``--preempt-signal``'s default (RunConfig's; a unit test keeps the two equal)."""

_caught: list[str] = []


def signal_name(argv: Sequence[str]) -> str:
    """The signal ``--preempt-signal`` names in ``argv``, else the default; as ``SIGUSR2``."""
    name = DEFAULT_SIGNAL
    for i, arg in enumerate(argv):
        if arg == "--preempt-signal" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--preempt-signal="):
            name = arg.split("=", 1)[1]
        elif arg == "--":
            break
    name = name.upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def latch(argv: Sequence[str]) -> None:
    """Catch the requeue signal named in ``argv`` (once); an unknown name is left to the CLI to refuse."""
    number = getattr(signal, signal_name(argv), None)
    if isinstance(number, signal.Signals):
        signal.signal(number, lambda signum, _frame: _caught.append(signal.Signals(signum).name))


def caught() -> str | None:
    """The name of the signal caught before the supervisor took over, if any."""
    return _caught[0] if _caught else None
