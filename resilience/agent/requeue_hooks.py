"""``ctx.on_requeue``: what a rank runs when the supervisor is about to requeue the job.

At a time limit or a preemption the supervisor persists the newest commit, then announces the
requeue (:meth:`RequeueChannel.announce <resilience.contract.channels.requeue.RequeueChannel.announce>`)
and waits for every rank that registered a hook to answer before the job ends. The hooks run on
a thread of this process, not the main thread, which may be blocked in a collective: between two
bytecodes of ``train``, as a signal handler would run. What they are for is what cannot be in a
commit: submitit's ``__submitit_checkpoint__`` (:mod:`resilience.submitit_rank`), a run's own
marker, a logger's last flush.

The thread starts with the first hook, so a process without hooks polls nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from resilience.contract.run_store import RunStore

log = logging.getLogger("resilience")

RequeueHook = Callable[[str], None]
"""Called with the requeue's cause: ``time-limit`` or ``preemption``."""


class RequeueHooks:
    """This process's hooks, and the thread that runs them when a requeue is announced."""

    POLL_S = 0.1

    def __init__(self, store: RunStore, slot: str) -> None:
        self.store, self.slot = store, slot
        self._hooks: list[RequeueHook] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._seen = 0

    def clear(self) -> None:
        """Forget the hooks: each entry of ``train`` adds its own (closures over its objects)."""
        with self._lock:
            self._hooks.clear()

    def add(self, hook: RequeueHook) -> None:
        """Run ``hook`` before a requeue (once, however often it is added)."""
        with self._lock:
            if hook in self._hooks:
                return
            self._hooks.append(hook)
            if self._thread is None:
                self.store = self.store.clone()  # the thread's own connection
                notice = self.store.requeue.notice()
                self._seen = notice.id if notice is not None else 0  # an earlier run's, in a reused store
                self.store.requeue.mark_hooked(self.slot)
                self._thread = threading.Thread(target=self._watch, name="sres-requeue-hooks", daemon=True)
                self._thread.start()

    def _watch(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.POLL_S):
            try:
                notice = self.store.requeue.notice()
                if notice is None or notice.id <= self._seen:
                    continue
                self._seen = notice.id
                self.store.requeue.answer(notice.id, self.slot, self.run_hooks(notice.cause))
            except Exception as err:  # noqa: BLE001 - the store is gone: the run ended
                log.debug("requeue hooks: %s", err)
                return

    def run_hooks(self, cause: str) -> str:
        """Run every hook; what the first that raised said ("" when none did). One failing hook
        does not stop the others: each may hold something of its own to save."""
        with self._lock:
            hooks = list(self._hooks)
        error = ""
        for hook in hooks:
            try:
                hook(cause)
            except Exception as err:  # noqa: BLE001 - a user's hook: reported, the requeue goes on
                log.warning("a requeue hook raised: %s: %s", type(err).__name__, err)
                error = error or f"{type(err).__name__}: {err}"
        return error
