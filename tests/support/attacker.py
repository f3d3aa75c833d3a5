"""What the attacker's processes of tests/security run (as another uid, with the repository on
their path): finding a victim's ports the way any user of a node can."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def listening(uid: int) -> Iterator[tuple[str, int]]:
    """Every listening TCP socket of ``uid``, IPv4 and IPv6 (``/proc/net/tcp*`` show them to
    all; torch's store and gloo listen on IPv6's any-address)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[7]) == uid:
            ip, port = f[1].split(":")
            yield ".".join(str(int(ip[i : i + 2], 16)) for i in (6, 4, 2, 0)), int(port, 16)
    try:
        lines = Path("/proc/net/tcp6").read_text().splitlines()[1:]
    except OSError:
        return  # no IPv6 here
    for line in lines:
        f = line.split()
        if f[3] == "0A" and int(f[7]) == uid:
            ip, port = f[1].split(":")
            words = [ip[i : i + 8] for i in range(0, 32, 8)]  # each a little-endian 32-bit word
            packed = b"".join(bytes.fromhex(w)[::-1] for w in words)
            yield ("::1" if packed == bytes(16) else socket.inet_ntop(socket.AF_INET6, packed)), int(port, 16)


def greeting(uid: int, prefix: bytes, timeout_s: float = 3.0) -> list[tuple[str, int]]:
    """The ports of ``uid`` whose first line starts with ``prefix`` (sres servers greet first),
    probed side by side: a busy victim may take a while to greet."""

    def greets(address: tuple[str, int]) -> bool:
        try:
            with socket.create_connection(address, timeout=timeout_s) as sock:
                sock.settimeout(timeout_s)
                return sock.makefile("rb").readline().startswith(prefix)
        except OSError:
            return False

    ports = list(listening(uid))
    with ThreadPoolExecutor(max(1, len(ports))) as pool:
        return [address for address, yes in zip(ports, pool.map(greets, ports)) if yes]


def pickled_checkpoint(root: Path, job: str, step: int, world: int, rank: int, payload: object) -> Path:
    """A rank's checkpoint directory in the format sres wrote before its files were data only
    (magic ``SRESCKP1``, a pickled header and skeleton), with ``payload`` as its state and a
    manifest whose checksum matches: what an attacker plants or pushes. No reader may unpickle
    it (the writer is another uid, and the old format's reader knows only plain data's names)."""
    import pickle
    import struct
    import time

    from resilience.state.snapshot import checksum
    from resilience.tiers import manifest as mf

    header = pickle.dumps(
        {"step": step, "skeleton": pickle.dumps(({"m": payload}, [])), "sizes": {}, "offsets": {}}
    )
    data = b"SRESCKP1" + struct.pack("<Q", len(header)) + header
    final = mf.rank_dir(root, step, rank)
    final.mkdir(parents=True, exist_ok=True)
    (final / "replicated.bin").write_bytes(data)
    entry = mf.FileEntry(len(data), checksum(header, []))
    mf.write_manifest(final, mf.Manifest(job, step, world, rank, {"replicated.bin": entry}, {}, time.time()))
    return final
