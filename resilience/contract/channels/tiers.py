"""Checkpoint tiers' coordination: where each rank's neighbour-copy server listens, and the
supervisor's persist-now requests with every rank's answer.
"""

from __future__ import annotations

from collections.abc import Iterable

from resilience.contract import keys
from resilience.contract.messages import FlushDone, FlushRequest
from resilience.contract.store_core import Channel


class TierChannel(Channel):
    """A flush is numbered, so a rank answers the request it saw, never a newer one."""

    def publish_address(self, slot: str, address: str) -> None:
        """host:port of a rank process's neighbour-copy server (resilience.tiers.transport)."""
        self._core.put_text(keys.tier_address(slot), address)

    def address(self, slot: str) -> str | None:
        return self._core.text(keys.tier_address(slot))

    def request_flush(self, step: int | None, timeout_s: float, generation: int = 0) -> int:
        """Supervisor: ask every rank of ``generation`` to persist now; returns the request's id."""
        return self._core.numbered(
            keys.FLUSH_SEQ,
            keys.FLUSH_REQUEST,
            lambda request: FlushRequest(request, step, timeout_s, generation),
        )

    def flush_request(self) -> FlushRequest | None:
        return self._core.get(keys.FLUSH_REQUEST, FlushRequest)

    def answer_flush(self, request: int, rank: int, done: FlushDone) -> None:
        self._core.put(keys.flush_done(request, rank), done)

    def flush_answers(self, request: int, ranks: Iterable[int]) -> list[FlushDone] | None:
        """Every rank's answer, or None while one is missing."""
        return self._core.get_all((keys.flush_done(request, rank) for rank in ranks), FlushDone)
