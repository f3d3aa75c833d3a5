"""The supervisor's "persist now" requests, answered on a thread of each rank (``FlushWatcher``);
the two halves of a flush are the saver's (``TierSaver.flush_hold``, ``flush_persistent``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from resilience.contract.messages import FlushDone, FlushRequest
from resilience.contract.run_store import RunStore
from resilience.errors import Fenced
from resilience.tiers.saver import TierSaver

log = logging.getLogger("resilience")


class FlushWatcher:
    """Answers the supervisor's "persist now" requests (``Supervisor.flush_persistent``).

    Polls the store on its own connection, so that a request is served even while training
    is blocked (no commit needed): the newest state in the RAM tier is what gets persisted.
    """

    def __init__(
        self,
        store: RunStore,
        saver: TierSaver,
        rank: Callable[[], int],
        poll_s: float = 0.25,
        generation: Callable[[], int] = lambda: 0,
    ) -> None:
        self.store = store
        self.saver = saver
        self.rank = rank
        self.generation = generation
        """The generation this process is a member of: it answers that generation's requests only."""
        self.poll_s = poll_s
        self.seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sres-flush", daemon=True)

    def start(self) -> "FlushWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                request = self.store.tiers.flush_request()
                if request is None or request.id <= self.seen or self.rank() < 0:
                    continue
                if request.generation and request.generation != self.generation():
                    continue  # not this process's to answer: another generation holds its rank
                self.seen = request.id
                self.store.tiers.answer_flush(request.id, self.rank(), self._answer(request))
            except Exception as err:  # noqa: BLE001 - the store is gone: the run ended
                log.debug("flush watcher: %s", err)
                return

    def _answer(self, request: FlushRequest) -> FlushDone:
        """The saver's half of the flush, or why it failed: a flush left unanswered holds the
        preempted job for the whole save timeout (a minute), then requeues it with nothing saved."""
        try:
            if request.step is None:
                return FlushDone(*self.saver.flush_hold(request.timeout_s))
            return FlushDone(*self.saver.flush_persistent(request.step, request.timeout_s))
        except Fenced:
            raise  # nothing may be written any more, not even the answer
        except Exception as err:  # noqa: BLE001 - said to the supervisor, whose flush-failed event shows it
            log.warning("flush of step %s failed: %s", request.step, err)
            return FlushDone(None, f"{type(err).__name__}: {err}")
