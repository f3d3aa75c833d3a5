"""The run's store, with every value it holds proved to come from the run.

torch's ``TCPStore`` has no authentication: anyone who reaches its port can list, read, set and
delete keys (``list_keys`` makes a secret key prefix worthless). Its clients are the run's own
processes, which know the run's secret (:mod:`resilience.contract.run_secret`), so each value is
stored behind an HMAC-SHA256 of the key and the value under that secret, and a value read back
without a valid one is refused (:class:`~resilience.errors.ForgedValue`). This covers torch's own
rendezvous keys too: process groups are formed on a ``PrefixStore`` over this store, so no one
else can put an address of theirs in a generation's gloo mesh.

What it does not cover, and why that is acceptable: ``add`` counters (an atomic add cannot
carry a tag; every counter here only says "look at the signed keys", which are checked), and
deletions (another user can always make a run fail; never make it compute something else or
run their code). The cost is one HMAC per value, microseconds next to a store round trip.

A Python ``dist.Store`` must be kept alive by Python: the C++ objects that hold one (a
``PrefixStore``, a process group, a ``clone`` torch asks for) do not keep its Python half, and a
call into a freed one fails with "Not implemented". :class:`RunStore` holds its own; clones made
for C++ are held in ``_HELD``.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from resilience.errors import ForgedValue

TAG = 32
_HELD: list["SignedStore"] = []
ENDED = b"\0sres: this key's generation ended"
"""What :meth:`SignedStore.end_waits` sets a waited-for key to: its reader raises at once."""


class SignedStore(dist.Store):
    def __init__(self, under: dist.Store, secret: str) -> None:
        super().__init__()
        self.under, self._key = under, bytes.fromhex(secret)
        self._secret = secret
        self.waiting: tuple[str, ...] = ()
        """The keys this connection's thread is blocked on now (its ``wait``)."""

    def _tagged(self, key: str, value: Any) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return hmac.new(self._key, key.encode() + b"\0" + data, hashlib.sha256).digest() + data

    def _checked(self, key: str, value: Any) -> bytes:
        raw = bytes(value)
        if len(raw) < TAG or not hmac.compare_digest(raw[:TAG], self._tagged(key, raw[TAG:])[:TAG]):
            raise ForgedValue(f"store key {key!r} holds a value the run did not write")
        return raw[TAG:]

    # What torch's C++ side calls (the names matter: deleteKey, getNumKeys), and the Python ones.
    def set(self, key: str, value: Any) -> None:
        self.under.set(key, self._tagged(key, value))  # type: ignore[arg-type]  # stubs: str; bytes work

    def get(self, key: str) -> bytes:
        value = self._checked(key, bytes(self.under.get(key)))
        if value == ENDED:
            raise dist.DistStoreError(f"store key {key!r}: its generation ended while it was awaited")
        return value

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        old = self._tagged(key, expected) if len(expected) else b""
        new = self._tagged(key, desired)
        return self._checked(key, self.under.compare_set(key, old, new))  # type: ignore[arg-type]  # as set

    def add(self, key: str, amount: int) -> int:
        return self.under.add(key, amount)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.waiting = tuple(keys)
        try:
            if timeout is None:
                self.under.wait(keys)
            else:
                self.under.wait(keys, timeout)
        finally:
            self.waiting = ()

    def end_waits(self, prefix: str, of: "SignedStore") -> int:
        """Wake ``of``'s thread (another connection's) from a wait on keys under ``prefix``: each
        such key is set to :data:`ENDED`, which its reader refuses. A generation's process groups
        rendezvous under a prefix of their own, and torch waits on that store with the
        generation's whole timeout, which the release of an ended generation (shutting its
        sockets down) does not reach: the rank stayed in the ended generation past the grace
        and exited to be restarted, and the ranks waiting on it did too (CI, a loaded 2-core
        machine: 3 such exits after one gloo connectFullMesh failure). Returns the keys set."""
        keys = [key for key in of.waiting if key.startswith(prefix)]
        for key in keys:
            self.set(key, ENDED)
        return len(keys)

    def check(self, keys: list[str]) -> bool:
        return self.under.check(keys)

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - torch's C++ name
        return self.under.delete_key(key)

    def getNumKeys(self) -> int:  # noqa: N802 - torch's C++ name
        return self.under.num_keys()

    delete_key, num_keys = deleteKey, getNumKeys

    def clone(self) -> "SignedStore":
        # torch's stubs omit Store.clone, which every store has.
        copy = SignedStore(self.under.clone(), self._secret)  # type: ignore[attr-defined]
        _HELD.append(copy)
        return copy

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)
