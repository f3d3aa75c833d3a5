"""Moving checkpoint directories between nodes.

Two transports, for two moments:

- :class:`NeighbourServer` / :func:`push_checkpoint`: plain TCP, used by the background
  neighbour lane after every RAM-tier save. It needs no collective, so a rank never has to
  agree with its peers on when to send, a dead neighbour costs a failed connect (a warning)
  and never a hung collective, and the receiver keeps working while its own training runs.
- :func:`send_checkpoint` / :func:`recv_checkpoint`: over the generation's gloo state group,
  used during recovery, when every rank is in the same collective phase anyway.

Either way the receiver writes into a temporary directory, the manifest last, and renames it
into place: a copy cut off by a fault is never taken for a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from resilience.tiers import manifest as mf
from resilience.tiers.layout import prune

log = logging.getLogger("resilience")

_CHUNK = 1 << 22


def _files_of(path: Path) -> list[Path]:
    """The files of a checkpoint directory, manifest last."""
    return sorted(
        (p for p in Path(path).iterdir() if p.is_file()), key=lambda p: (p.name == mf.MANIFEST, p.name)
    )


@contextlib.contextmanager
def _staged(final: Path) -> Iterator[Path]:
    """A temporary directory next to ``final``, renamed into place when the block succeeds and
    removed when it fails: a copy cut off half-way is never taken for a checkpoint."""
    tmp = final.with_name(f"{final.name}.in-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        mf.publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _safe_name(name: str) -> str:
    if "/" in name or name.startswith(".") or not name:
        raise mf.CheckpointInvalid(f"bad file name in a checkpoint transfer: {name!r}")
    return name


# --- TCP: the background neighbour copy ---------------------------------------------------------


class NeighbourServer:
    """Receives other nodes' RAM-tier checkpoints into this node's ``neighbour`` root.

    One per rank process (any process of a node can take the node's copies); a thread per
    connection, so a slow sender does not hold up another.
    """

    def __init__(self, root: Path, job_id: str, keep: int, host: str = "127.0.0.1") -> None:
        self.root, self.job_id, self.keep = Path(root), job_id, keep
        self._sock = socket.create_server((host, 0))
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sres-neighbour-server", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> "NeighbourServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._handle, args=(conn,), name="sres-neighbour-recv", daemon=True
            ).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                reader = conn.makefile("rb")
                header = json.loads(reader.readline())
                if header["job"] != self.job_id:
                    raise ValueError(f"a checkpoint of job {header['job']} sent to job {self.job_id}")
                owner, step = int(header["owner"]), int(header["step"])

                view = memoryview(bytearray(_CHUNK))  # one buffer for the whole copy
                with _staged(mf.rank_dir(self.root, step, owner)) as tmp:
                    for name, size in header["files"]:
                        with open(tmp / _safe_name(name), "wb") as f:
                            left = int(size)
                            while left:
                                n = reader.readinto(view[: min(left, _CHUNK)])
                                if not n:
                                    raise ConnectionError("neighbour copy cut off")
                                f.write(view[:n])
                                left -= n
                with self._lock:
                    prune(self.root, self.keep, owner=owner)
                conn.sendall(b"ok\n")
            except Exception as err:  # noqa: BLE001 - the sender sees the missing "ok"
                log.warning("neighbour copy not received: %s", err)


def push_checkpoint(
    address: str, src: Path, job_id: str, owner: int, step: int, timeout_s: float = 300.0
) -> int:
    """Send a checkpoint directory to a neighbour's server; returns the bytes sent. Raises
    OSError/ConnectionError when the neighbour did not confirm it."""
    host, port = address.rsplit(":", 1)
    files = _files_of(src)
    header = {
        "job": job_id,
        "owner": owner,
        "step": step,
        "files": [(p.name, p.stat().st_size) for p in files],
    }
    sent = 0
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(json.dumps(header).encode() + b"\n")
        for path in files:
            with open(path, "rb") as f:
                sent += sock.sendfile(f)
        sock.shutdown(socket.SHUT_WR)
        reply = sock.makefile("rb").readline()
    if reply.strip() != b"ok":
        raise ConnectionError(f"neighbour {address} did not confirm step {step} of rank {owner}")
    return sent


# --- gloo: transfers during recovery -----------------------------------------------------------


def send_checkpoint(src: Path, dst: int, group: dist.ProcessGroup | None = None) -> int:
    """Send a checkpoint directory to rank ``dst``. A directory that cannot be read is sent as
    an error, so that the receiver fails over to the next tier instead of waiting."""
    try:
        files = [(p.name, p.read_bytes()) for p in _files_of(src)]
        meta = pickle.dumps({"files": [(name, len(data)) for name, data in files]})
    except OSError as err:
        files, meta = [], pickle.dumps({"error": f"{src}: unreadable on the holder ({err})"})
    dist.send(torch.tensor([len(meta)], dtype=torch.int64), dst, group=group)
    dist.send(torch.frombuffer(bytearray(meta), dtype=torch.uint8), dst, group=group)
    for _, data in files:
        if data:
            dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=group)
    return len(meta) + sum(len(data) for _, data in files)


def recv_checkpoint(final: Path, src: int, group: dist.ProcessGroup | None = None) -> int:
    """Receive a checkpoint directory from rank ``src`` into ``final`` (temporary directory,
    manifest last, rename). Raises CheckpointInvalid when the holder could not read it."""
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group)
    meta = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(meta, src, group=group)
    info = pickle.loads(meta.numpy().tobytes())
    if "error" in info:
        raise mf.CheckpointInvalid(info["error"])
    received = []
    for name, n in info["files"]:
        t = torch.empty(n, dtype=torch.uint8)
        if n:
            dist.recv(t, src, group=group)
        received.append((name, t))
    with _staged(final) as tmp:
        for name, t in received:
            (tmp / _safe_name(name)).write_bytes(memoryview(t.numpy()))
    return sum(t.numel() for _, t in received)
