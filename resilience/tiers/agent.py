"""The tiers inside a rank process: what the in-process agent calls, in one place.

Owns the saver (:mod:`resilience.tiers.saver`), the neighbour-copy server
(:mod:`resilience.tiers.transport`), the flush watcher (:mod:`resilience.tiers.flush`), and
runs restores (:mod:`resilience.tiers.restore`). Events go to the supervisor through the store.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from resilience.contract.messages import Plan
from resilience.contract.run_store import RunStore
from resilience.tiers.restore import Restored, Restorer
from resilience.tiers.flush import FlushWatcher
from resilience.tiers.saver import TierPlace, TierSaver
from resilience.tiers.budget import CopyCost
from resilience.tiers.transport import NeighbourLink, NeighbourServer
from resilience.tiers.layout import (
    NodeKey,
    TierConfig,
    neighbour_node,
    neighbour_root,
    own_root,
    record_job_config,
)

log = logging.getLogger("resilience")


class TierAgent:
    def __init__(
        self,
        config: TierConfig,
        store: RunStore,
        slot: str,
        node: int,
        rank: Callable[[], int],
        secret: str,
        host: str = "127.0.0.1",
        node_name: str = "",
    ) -> None:
        self.config, self.slot, self.node, self.rank = config, slot, node, rank
        self.secret = secret
        self.ram_node: NodeKey = node_name or node
        """Where this node's RAM tier lives; ``node`` (the index) picks the neighbour."""
        self.store = store.clone()
        self._lock = threading.Lock()
        self.plan: Plan | None = None
        self._addresses: dict[str, str] = {}
        if config.ram:
            record_job_config(config)
        cost = CopyCost()
        self.server = None
        if config.neighbour:
            self.server = NeighbourServer(
                neighbour_root(config.job_id, self.ram_node),
                config.job_id,
                config.keep_ram,
                secret,
                host,
                generation=lambda: self.plan.generation if self.plan else 0,
                cost=cost,
                local=own_root(config.job_id, self.ram_node),
            ).start()
            store.tiers.publish_address(slot, self.server.address)
        self.saver = TierSaver(config, TierPlace(-1, 0, self.ram_node), self.emit, cost=cost)
        self.flush = FlushWatcher(
            store.clone(), self.saver, rank, generation=lambda: self.plan.generation if self.plan else 0
        ).start()

    @classmethod
    def create(
        cls,
        config: TierConfig | None,
        store: RunStore,
        slot: str,
        node: int,
        rank: Callable[[], int],
        secret: str,
        store_host: str = "127.0.0.1",
        node_name: str = "",
    ) -> "TierAgent | None":
        if config is None or not config.enabled:
            return None
        host = "127.0.0.1" if store_host in ("127.0.0.1", "localhost") else _address_toward(store_host)
        return cls(config, store, slot, node, rank, secret, host, node_name)

    def emit(self, event: str, **fields: Any) -> None:
        try:
            with self._lock:
                self.store.events.push(event, **{"rank": self.rank(), **fields})
        except Exception as err:  # noqa: BLE001 - the store is gone: the run is ending
            log.warning("tier event %s not delivered: %s (%s)", event, fields, err)

    def enter(self, plan: Plan, rank: int) -> None:
        """A new generation: the saver writes as this rank, copies go to the next node of the plan."""
        self.plan = plan
        self.saver.place = TierPlace(rank, plan.world_size, self.ram_node, self._neighbour, plan.generation)

    def _neighbour(self) -> NeighbourLink | None:
        plan = self.plan
        if plan is None:
            return None
        target = neighbour_node(self.node, [info.node for info in plan.slots.values()])
        if target is None:
            return None
        on_target = sorted(
            (s for s, info in plan.slots.items() if info.node == target),
            key=lambda s: plan.slots[s].local_rank,
        )
        for slot in on_target:
            if slot not in self._addresses:
                with self._lock:
                    address = self.store.tiers.address(slot)
                if address is None:
                    continue
                self._addresses[slot] = address
            return NeighbourLink(self._addresses[slot], self.secret)
        return None

    def restore(self, plan: Plan, group: dist.ProcessGroup, after_step: int) -> Restored | None:
        """Collective: the newest step the tiers hold after ``after_step``, loaded (None if none)."""
        self.saver.wait_ram(60.0)
        restorer = Restorer(self.config, self.rank(), plan.world_size, self.ram_node, group, self.emit)
        result = restorer.restore(restorer.gather_offers(), after_step)
        if result is not None and self.rank() == 0:
            self.emit(
                "restored",
                step=result.step,
                generation=plan.generation,
                source=result.source,
                tiers={str(r): t for r, t in sorted(result.tiers.items())},
                seconds=result.seconds,
                bytes=result.bytes_moved,
                borrowed={str(r): o for r, o in sorted(result.borrowed.items())},
            )
        return result

    def close(self) -> None:
        self.flush.stop()
        self.saver.close()
        if self.server is not None:
            self.server.stop()


def _address_toward(host: str) -> str:
    """This machine's address on the network that reaches ``host`` (the supervisor's): where the
    neighbour server listens. The host name's address was another interface's on machines with
    several (a node in a network namespace of its own had none of the name's)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: no packet is sent, the route is looked up
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()
