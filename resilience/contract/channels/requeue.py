"""Before the job is requeued: which ranks run ``ctx.on_requeue`` hooks, the supervisor's notice,
and each rank's answer (empty, or what a hook raised).
"""

from __future__ import annotations

from collections.abc import Iterable

from resilience.contract import keys
from resilience.contract.messages import RequeueNotice
from resilience.contract.store_core import Channel


class RequeueChannel(Channel):
    """The supervisor waits only for the slots that said they have hooks."""

    def mark_hooked(self, slot: str) -> None:
        """Rank: this process runs hooks before a requeue; the supervisor waits for its answer."""
        self._core.flag(keys.requeue_hooked(slot))

    def hooked(self, slots: Iterable[str]) -> list[str]:
        return [slot for slot in slots if self._core.exists(keys.requeue_hooked(slot))]

    def announce(self, cause: str, timeout_s: float) -> int:
        """Supervisor: the job is about to be requeued; returns the notice's id."""
        return self._core.numbered(
            keys.REQUEUE_SEQ, keys.REQUEUE_NOTICE, lambda notice: RequeueNotice(notice, cause, timeout_s)
        )

    def notice(self) -> RequeueNotice | None:
        return self._core.get(keys.REQUEUE_NOTICE, RequeueNotice)

    def answer(self, notice: int, slot: str, error: str) -> None:
        """Rank: its hooks ran (``error``: empty, or what one of them raised)."""
        self._core.put_quoted(keys.requeue_done(notice, slot), error)

    def answers(self, notice: int, slots: Iterable[str]) -> dict[str, str]:
        """The answers that arrived so far, by slot (empty: every hook ran)."""
        answers = {slot: self._core.get_quoted(keys.requeue_done(notice, slot)) for slot in slots}
        return {slot: error for slot, error in answers.items() if error is not None}


class ProducerChannel(Channel):
    """A node's batch producer runs only while one of its ranks reads batches from a cache."""

    def want(self, node: int) -> None:
        """Rank: this node's ranks read batches from a cache; the supervisor keeps its producer running."""
        self._core.flag(keys.batch_producer(node))
        self._core.add(keys.BATCH_PRODUCER_ASKS)

    def asks(self) -> int:
        """How many asks were made: the supervisor reads who asked (one request a node) only when
        this moves, not every look (at 512 nodes, 2,560 requests a second)."""
        return self._core.count(keys.BATCH_PRODUCER_ASKS)

    def wanted(self, nodes: Iterable[int]) -> list[int]:
        return [node for node in nodes if self._core.has(keys.batch_producer(node))]
