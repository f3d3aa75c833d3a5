"""Fault injection's coordination (tests, the demo, chaos): each injection fires once per run,
ranks meet before a fault that needs them all, and node, child and slow faults are asked of
the supervisor, which alone can perform them.
"""

from __future__ import annotations

from resilience.contract import keys
from resilience.contract.store_core import Channel


class FaultChannel(Channel):
    """Once-only firing rests on the store's atomic counter: exactly one caller sees 1."""

    def first_to_fire(self, index: int, suffix: str = "") -> bool:
        """Whether this call is the first for injection ``index`` (each fires once per run)."""
        return self._core.add(keys.fired(index) + suffix) == 1

    def arrive(self, index: int) -> None:
        self._core.add(keys.fired(index) + "/arrived")

    def arrived(self, index: int) -> int:
        return self._core.count(keys.fired(index) + "/arrived")

    def mark_node_kill(self, node: int, spec: str) -> None:
        """Ask for ``node``'s loss; the supervisor looks once :meth:`announce_node_kills` is called."""
        self._core.put_text(keys.node_kill(node), spec)

    def announce_node_kills(self) -> None:
        self._core.add(keys.NODE_KILLS)

    def node_kill_requests(self) -> int:
        return self._core.count(keys.NODE_KILLS)

    def take_node_kill(self, node: int) -> bool:
        """Supervisor: whether node N was asked to be killed (the request is consumed)."""
        return self._core.take(keys.node_kill(node))

    def request_link_fault(self, spec: str) -> None:
        """Ask the supervisor to break a node's link (``cut:N:for=D:step=S`` and its kin)."""
        self._core.put_text(keys.link_fault(self._core.add(keys.LINK_FAULTS)), spec)

    def link_faults_after(self, seen: int) -> tuple[int, list[str]]:
        """Supervisor: the specs of the link faults asked for after the ``seen`` first, and how
        many are seen now. A request is two writes (its number, then its spec): one counted but
        not yet written is read at the next look, with those after it. Taken as seen at once, it
        was lost for good (CI: a loaded machine read the count in between; the cut never came)."""
        count = self._core.count(keys.LINK_FAULTS)
        specs = []
        for n in range(seen + 1, count + 1):
            spec = self._core.text(keys.link_fault(n))
            if not spec:  # its writer is between its two writes (or died there: injected faults only)
                break
            specs.append(spec)
            seen = n
        return seen, specs

    def request_child_kill(self, spec: str) -> None:
        self._core.put_text(keys.CHILD_KILL, spec)

    def take_child_kill(self) -> bool:
        return self._core.take(keys.CHILD_KILL)

    def mark_slow(self, node: int, factor: float) -> None:
        self._core.put_float(keys.slow(node), factor)

    def slow_factor(self, node: int) -> float | None:
        return self._core.get_float(keys.slow(node))
