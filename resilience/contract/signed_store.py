"""The run's store, with every value it holds sealed under the run's key: proved to come from
the run, and read by no one else.

torch's ``TCPStore`` has no authentication: anyone who reaches its port can list, read, set and
delete keys (``list_keys`` makes a secret key prefix worthless). Its clients are the run's own
processes, which know the run's secret (:mod:`resilience.contract.run_secret`), so each value is
stored sealed with AES-SIV under a key derived from it, the value's key name bound in as
associated data: a value read back that does not open is refused
(:class:`~resilience.errors.ForgedValue`), and one that does is the run's own, for this key. A
stranger who reads the store (a user on any node of the job can reach it) learns key names and
sizes, not plans, hosts or ports. This covers torch's own rendezvous keys too: process groups
are formed on a ``PrefixStore`` over this store, so no one else can put an address of theirs in
a generation's gloo mesh, or read one. SIV is deterministic (the same value seals the same way
under one key), which ``compare_set`` needs, and reveals only that two values are equal.

What it does not cover, and why that is acceptable: ``add`` counters (an atomic add cannot
carry a tag; every counter here only says "look at the sealed keys", which are checked), and
deletions (another user can always make a run fail; never make it compute something else or
run their code). The cost is about 1 us per value, next to a store round trip of 50-100 us.

A Python ``dist.Store`` must be kept alive by Python: the C++ objects that hold one (a
``PrefixStore``, a process group, a ``clone`` torch asks for) do not keep its Python half, and a
call into a freed one fails with "Not implemented". :class:`RunStore` holds its own; clones made
for C++ are held in ``_HELD``.
"""

from __future__ import annotations

import zlib
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from resilience.errors import ForgedValue

TAG = 16
"""Bytes a sealed value is longer than the value (SIV's synthetic IV), plus one (:data:`PACK_OVER`)."""
PACK_OVER = 4096
"""Values longer than this are compressed before they are sealed (a flag byte says which): a
plan names every member, and every rank reads it, so its size is paid N times per generation
(at 1,024 ranks, 60 KB each, 120 MB through the store for one recovery)."""
_PLAIN, _PACKED = b"\0", b"\1"
_HELD: list["SignedStore"] = []
ENDED = b"\0sres: this key's generation ended"
"""What :meth:`SignedStore.end_waits` sets a waited-for key to: its reader raises at once."""


class SignedStore(dist.Store):
    def __init__(self, under: dist.Store, secret: str) -> None:
        super().__init__()
        self.under, self._seal = under, AESSIV(_seal_key(secret))
        self._secret = secret
        self.waiting: tuple[str, ...] = ()
        """The keys this connection's thread is blocked on now (its ``wait``)."""

    def _tagged(self, key: str, value: Any) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        packed = _PACKED + zlib.compress(data, 1) if len(data) > PACK_OVER else _PLAIN + data
        return self._seal.encrypt(packed, [key.encode()])

    def _checked(self, key: str, value: Any) -> bytes:
        try:
            packed = self._seal.decrypt(bytes(value), [key.encode()])
        except (InvalidTag, ValueError):  # not ours, not for this key, or too short to be sealed
            raise ForgedValue(f"store key {key!r} holds a value the run did not write") from None
        return zlib.decompress(packed[1:]) if packed[:1] == _PACKED else packed[1:]

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
        """One round trip for every key (each must exist); each value checked as :meth:`get` does."""
        return [self._checked(k, v) for k, v in zip(keys, self.under.multi_get(keys))]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        """One round trip for every key, each value sealed as :meth:`set` seals it."""
        sealed = [self._tagged(k, v) for k, v in zip(keys, values, strict=True)]
        # torch's stubs omit Store.multi_set, which every store has.
        self.under.multi_set(keys, sealed)  # type: ignore[attr-defined]


def _seal_key(secret: str) -> bytes:
    """AES-256-SIV's 64 bytes from the run's key (hex): HKDF, so the key that seals store values
    is used for nothing else."""
    return HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=b"sres store seal").derive(
        bytes.fromhex(secret)
    )
