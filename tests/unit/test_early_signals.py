"""A forked rank keeps the signals Slurm sends before it has set its own handlers: a preemption's
``--signal`` that came in that window killed it (the default action), and the flush that the
preemption asks for waited its whole minute for a rank that was gone (a CI run, 1 of 2)."""

from __future__ import annotations

import os
import signal

from resilience import fork_server


def test_a_signal_before_the_ranks_handlers_is_kept_then_handed_over():
    before = signal.getsignal(signal.SIGUSR2)
    try:
        signal.signal(signal.SIGUSR2, fork_server._remember)  # as _become_child leaves it
        os.kill(os.getpid(), signal.SIGUSR2)
        assert fork_server.early_signals() == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # as before the fork
        assert fork_server.early_signals() == []
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_the_ending_signals_end_a_child_as_they_did():
    assert set(fork_server.ENDING) <= set(fork_server.RELAYED)
    assert signal.SIGUSR2 not in fork_server.ENDING and signal.SIGTERM in fork_server.ENDING
