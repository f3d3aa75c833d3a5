"""The batch producers: one process per node whose ranks read a ``resilience.BatchCache``.

A producer is not a rank: no plan names it and its death is no fault. It is started when a
rank of its node asks (``RunStore.producers.want``: ``resilience.run(train, batches=...)``),
started again when it dies (a ``batch-producer`` event says so; the ranks meanwhile make
what they need themselves) and stopped when its node leaves the run or the run ends. It runs
the training command like a rank, in slot ``n<node>b``. The loop ticks it (a
:class:`~launcher.supervisor.tickers.Ticker`) with the nodes it is given a callable for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from launcher.observability.events import EventLog
from launcher.placement import NodeNames, RankProcesses
from resilience.contract import slots
from resilience.contract.run_store import RunStore

CHECK_S = 0.2
"""How often the supervisor looks for asks and exits (a producer's absence costs no correctness)."""


class BatchProducers:
    def __init__(
        self,
        store: RunStore,
        processes: RankProcesses,
        names: NodeNames,
        command: Iterable[str],
        env: Callable[[str, int, int], dict[str, str]],
        events: EventLog,
        nodes: Callable[[], Iterable[int]],
    ) -> None:
        self.store, self.processes, self.names, self.events = store, processes, names, events
        self.command, self.env, self.nodes = list(command), env, nodes
        self.running: dict[int, str] = {}
        """node -> the slot of its producer, started and not stopped."""
        self._next = 0.0
        self._asked: tuple[int, frozenset[int]] = (0, frozenset())
        """The ask count and member nodes the wanted nodes were read at, and those nodes."""
        self._wanted: list[int] = []

    def tick(self, now: float) -> None:
        """Keep a producer on each node holding ranks now whose ranks asked for one (``nodes``)."""
        if now < self._next:
            return
        self._next = now + CHECK_S
        nodes = set(self.nodes())
        for node in [n for n in self.running if n not in nodes]:
            self.processes.kill(self.running.pop(node))  # its node left the run
        for node in self._wanted_now(nodes):
            slot = self.running.get(node)
            code = self.processes.poll(slot) if slot is not None else None
            if slot is not None and code is None:
                continue
            self._start(node, "started" if slot is None else "restarted", code)

    def _wanted_now(self, nodes: set[int]) -> list[int]:
        """The nodes whose ranks asked for a producer, read again only when someone asked since
        or the members changed."""
        asked = (self.store.producers.asks(), frozenset(nodes))
        if asked != self._asked:
            self._asked, self._wanted = asked, self.store.producers.wanted(sorted(nodes))
        return self._wanted

    def _start(self, node: int, how: str, code: int | None) -> None:
        slot = slots.producer_slot(node)
        self.processes.spawn(slot, node, self.command, self.env(slot, node, 0))
        self.running[node] = slot
        self.events.emit(
            "batch-producer",
            node=node,
            host=self.names.host(node),
            how=how,
            **({"exit_code": code} if code is not None else {}),
        )

    def stop(self) -> None:
        for slot in self.running.values():
            self.processes.kill(slot)
        self.running.clear()
