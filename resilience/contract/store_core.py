"""The one place that turns a run's store values into bytes and back, so no channel can encode
a value its reader decodes differently.

Every channel of :class:`~resilience.contract.run_store.RunStore` goes through :class:`StoreCore`:
messages (:mod:`~resilience.contract.messages`) as their JSON, numbers as their ``repr``/``str``,
flags as ``"1"``, counters as the store's atomic ``add``. Given the run's secret the core signs
every value (:class:`~resilience.contract.signed_store.SignedStore`); a value another user wrote
reads as absent, and its key is noted once in :attr:`StoreCore.forged` for the supervisor.
"""

from __future__ import annotations

import json
import socket
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from resilience.contract.messages import Message
from resilience.contract.signed_store import SignedStore
from resilience.errors import ForgedValue

M = TypeVar("M", bound=Message)


def alone() -> dist.Store:
    """The store of a process group of one (``python train.py`` started alone): in-process, no
    port, no file; nobody else can reach it, and there is no supervisor to share it with."""
    return dist.HashStore()


class StoreCore:
    """Typed primitives over a ``torch.distributed.Store`` (a client or the supervisor's server)."""

    def __init__(self, store: dist.Store, secret: str | None = None) -> None:
        self.under = store
        self.raw: dist.Store = SignedStore(store, secret) if secret else store
        self.forged: deque[str] = deque(maxlen=100)  # keys refused (each once); the supervisor empties it
        self._forged_seen: set[str] = set()
        self.guard: Callable[[str], None] | None = None
        """A rank's lease check (:meth:`resilience.contract.lease.Lease.check`), asked before every
        write: a rank cut off from the supervisor past its lease writes nothing (it raises)."""

    @classmethod
    def host(cls, secret: str, timeout_s: float = 60.0, address: str = "127.0.0.1") -> "StoreCore":
        """The supervisor's server, on a free port of ``address`` (where ranks reach it: loopback
        for a run on one machine): a rank never hosts it, so losing one loses no key. Left to
        itself torch's server listens on every interface; it is handed a socket of ours instead."""
        listener = socket.create_server((address, 0), backlog=4096)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            address,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
            master_listen_fd=listener.detach(),  # torch's server's from now on
        )
        return cls(store, secret)

    @classmethod
    def connect(
        cls, host: str, port: int, secret: str, timeout_s: float = 60.0, connect_s: float = 15.0
    ) -> "StoreCore":
        """A rank's client. The supervisor's store is up before any rank starts: a connection taking
        over ``connect_s`` means it is gone (a cancelled job), and the rank ends in seconds."""
        store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=connect_s), wait_for_workers=False
        )
        store.set_timeout(timedelta(seconds=timeout_s))
        return cls(store, secret)

    @property
    def port(self) -> int:  # the supervisor's server's (a TCPStore, made by host())
        assert isinstance(self.under, dist.TCPStore), type(self.under)
        return self.under.port

    def clone(self) -> "StoreCore":
        """A connection of its own, for another thread (a client is not thread-safe); forged keys
        are still noted in the one place the supervisor empties."""
        # torch's stubs (torch/_C/_distributed_c10d.pyi) omit Store.clone, which every store has.
        raw = self.raw.clone()  # type: ignore[attr-defined]
        twin = StoreCore(raw.under if isinstance(raw, SignedStore) else raw)
        twin.raw, twin.forged, twin._forged_seen = raw, self.forged, self._forged_seen
        twin.guard = self.guard
        return twin

    def end_waits(self, prefix: str, of: "StoreCore") -> int:
        """Wake ``of``'s thread from a wait on keys under ``prefix`` (:meth:`SignedStore.end_waits`);
        0 on an unsigned store (tests' plain stores: nothing to wake through)."""
        if isinstance(self.raw, SignedStore) and isinstance(of.raw, SignedStore):
            return self.raw.end_waits(prefix, of.raw)
        return 0

    def prefixed(self, prefix: str) -> dist.Store:
        """A store for torch's own keys (a process group's rendezvous), signed like ours."""
        return dist.PrefixStore(prefix, self.raw)

    # --- reading ----------------------------------------------------------------------------

    def value(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it is absent or another user wrote it."""
        if not self.raw.check([key]):
            return None
        try:
            return self.raw.get(key)
        except ForgedValue:
            if key not in self._forged_seen:
                self._forged_seen.add(key)
                self.forged.append(key)
            return None

    def has(self, key: str) -> bool:
        """Whether the run wrote ``key`` (a forged value does not count)."""
        return self.value(key) is not None

    def exists(self, key: str) -> bool:
        """Whether ``key`` is set at all, without reading it: for a key whose value says nothing."""
        return self.raw.check([key])

    def text(self, key: str) -> str | None:
        value = self.value(key)
        return value.decode(errors="replace") if value is not None else None

    def get(self, key: str, kind: type[M]) -> M | None:
        text = self.text(key)
        return kind.decode(text) if text is not None else None

    def get_all(self, names: Iterable[str], kind: type[M]) -> list[M] | None:
        """Every key's message, or None while one is missing (or forged). Two round trips
        whatever their number (a check, then one ``multi_get``): a supervisor reading 4,096
        ranks' reports one key at a time made 8,192 requests."""
        names = list(names)
        if not names:
            return []
        if not self.raw.check(names):
            return None
        try:
            return [kind.decode(v) for v in self.raw.multi_get(names)]
        except ForgedValue:  # one is not the run's: read them one by one, which notes it; take none
            for name in names:
                self.value(name)
            return None

    @staticmethod
    def parse(text: str, kind: type[M]) -> M | None:
        """A message :meth:`put` wrote, carried some other way (a notice), or None where it does
        not decode: the store holds it too."""
        try:
            return kind.decode(text)
        except (ValueError, KeyError, TypeError):
            return None

    def strict(self, key: str, kind: type[M]) -> M:
        """A message that must decode: raises (a ``ValueError`` when forged) for a reader that
        tells a bad record from a missing one."""
        return kind.decode(self.raw.get(key))

    def get_float(self, key: str) -> float | None:
        text = self.text(key)
        return float(text) if text is not None else None

    def get_int(self, key: str) -> int | None:
        text = self.text(key)
        return int(text) if text is not None else None

    def get_quoted(self, key: str) -> str | None:
        text = self.text(key)
        return str(json.loads(text)) if text is not None else None

    def count(self, key: str) -> int:
        return self.raw.add(key, 0)

    def wait(self, key: str, timeout_s: float) -> bool:
        """Block until ``key`` is set (by anyone: check what it means after) or ``timeout_s``
        passes (False). One request, answered by the store when the key is set: a wait that
        polls costs the store a request per poll per waiter."""
        try:
            self.raw.wait([key], timedelta(seconds=max(timeout_s, 0.001)))
        except dist.DistStoreError:
            return False
        return True

    # --- writing ----------------------------------------------------------------------------

    def _set(self, key: str, value: str) -> None:
        if self.guard is not None:
            self.guard(f"write {key}")
        self.raw.set(key, value)

    def put(self, key: str, message: Message) -> str:
        """Returns the text written: what a notice may carry as well (:meth:`parse`)."""
        text = message.encode()
        self._set(key, text)
        return text

    def put_all(self, messages: Mapping[str, Message]) -> None:
        """Several messages in one round trip (the store writes them in turn, not at once)."""
        if self.guard is not None:
            self.guard(f"write {', '.join(messages)}")
        values = [m.encode() for m in messages.values()]
        self.raw.multi_set(list(messages), values)  # type: ignore[attr-defined]  # in every store, not torch's stubs

    def put_text(self, key: str, text: str) -> None:
        self._set(key, text)

    def put_float(self, key: str, number: float) -> None:
        self._set(key, repr(number))

    def put_int(self, key: str, number: int) -> None:
        self._set(key, str(number))

    def put_quoted(self, key: str, text: str) -> None:
        """Text that may be empty: quoted, so an empty answer is still a value."""
        self._set(key, json.dumps(text))

    def flag(self, key: str) -> None:
        self._set(key, "1")

    def add(self, key: str, amount: int = 1) -> int:
        if self.guard is not None:
            self.guard(f"add to {key}")
        return self.raw.add(key, amount)

    def numbered(self, counter: str, key: str, make: Callable[[int], Message]) -> int:
        """Put the message ``make`` builds with the next number of ``counter`` (a request's id,
        which its answers name, so an answer to an older request is never taken for this one)."""
        number = self.add(counter)
        self.put(key, make(number))
        return number

    def first_int(self, key: str, proposal: int) -> int:
        """The first number any client proposed for ``key`` (this one's when it was first)."""
        if self.guard is not None:
            self.guard(f"propose {key}")
        return int(self.raw.compare_set(key, "", str(proposal)))

    def take(self, key: str) -> bool:
        """Whether the run set ``key``; it is consumed (deleted) when it was."""
        if not self.has(key):
            return False
        self.raw.delete_key(key)
        return True


class Channel:
    """Base of the store's channels: each holds the core and never the raw store."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
