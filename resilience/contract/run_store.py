"""A run's coordination store, typed: the object the supervisor and every rank hold.

The supervisor hosts a ``TCPStore``; losing rank 0 therefore never loses the store. Each
conversation over it is a channel (:mod:`resilience.contract.channels`), and every key and
value goes through one :class:`~resilience.contract.store_core.StoreCore`: keys are spelled in
:mod:`resilience.contract.keys`, values are :mod:`~resilience.contract.messages`, encoded in
the core alone. In the manner of NVIDIA resiliency's ``StoreMixin``, no caller makes a raw call.
"""

from __future__ import annotations

from collections import deque

import torch.distributed as dist

from resilience.contract.channels.faults import FaultChannel
from resilience.contract.channels.liveness import LivenessChannel
from resilience.contract.channels.plans import PlanChannel
from resilience.contract.channels.progress import ProgressChannel
from resilience.contract.channels.requeue import ProducerChannel, RequeueChannel
from resilience.contract.channels.signals import EventChannel, SignalChannel
from resilience.contract.channels.tiers import TierChannel
from resilience.contract.store_core import StoreCore


class RunStore:
    """One connection to the run's store and its channels: a thread that needs its own
    connection takes a :meth:`clone`, with channels of its own over it."""

    def __init__(self, store: dist.Store | StoreCore, secret: str | None = None) -> None:
        self.core = store if isinstance(store, StoreCore) else StoreCore(store, secret)
        core = self.core
        self.plans = PlanChannel(core)
        self.liveness = LivenessChannel(core)
        self.progress = ProgressChannel(core)
        self.events = EventChannel(core)
        self.signals = SignalChannel(core, self.events)
        self.tiers = TierChannel(core)
        self.producers = ProducerChannel(core)
        self.requeue = RequeueChannel(core)
        self.faults = FaultChannel(core)

    @classmethod
    def host(cls, secret: str, timeout_s: float = 60.0, address: str = "127.0.0.1") -> "RunStore":
        """The supervisor's server, on a free port of ``address``."""
        return cls(StoreCore.host(secret, timeout_s, address))

    @classmethod
    def connect(
        cls, host: str, port: int, secret: str, timeout_s: float = 60.0, connect_s: float = 15.0
    ) -> "RunStore":
        """A rank's client (see :meth:`StoreCore.connect` for why it gives up fast)."""
        return cls(StoreCore.connect(host, port, secret, timeout_s, connect_s))

    def clone(self) -> "RunStore":
        """A connection of its own, for another thread (a client is not thread-safe)."""
        return RunStore(self.core.clone())

    @property
    def port(self) -> int:
        return self.core.port

    @property
    def forged(self) -> deque[str]:
        """Keys whose value another user wrote (each once); the supervisor empties it."""
        return self.core.forged

    @property
    def raw(self) -> dist.Store:
        return self.core.raw
