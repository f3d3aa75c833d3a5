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
import errno
import hashlib
import hmac
import json
import logging
import os
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resilience.contract import run_secret
from resilience.contract.unproven import UnprovenConnections
from resilience.tiers import manifest as mf
from resilience.tiers.budget import CopyCost
from resilience.tiers.layout import prune
from resilience.tiers.same_bits import SameBits

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
    mf.private_step_dir(tmp)
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

GREETING = b"sres-neighbour"
MAX_HEADER = 1 << 16
"""A header names the files of one rank's directory; a longer line is not a rank's."""
MAX_FILES = 4096
MAX_UNPROVEN = 32
"""Connections that have not proved the secret yet; past it the oldest is cut
(:mod:`resilience.contract.unproven`)."""
MAX_CONNECTIONS = 16
"""Copies received at once (a rank sends one at a time); a proven sender past it waits up to
:data:`HELLO_TIMEOUT_S`, then is refused."""
HELLO_TIMEOUT_S = 10.0
"""A sender proves the run's secret within this long, or is cut off."""


@dataclass(frozen=True)
class NeighbourLink:
    """Where the next node's server listens, and what proves a copy comes from this run."""

    address: str
    secret: str = field(repr=False)


def _proof(secret: str, challenge: str, header: dict[str, Any]) -> str:
    """The header's HMAC under the run's secret. It covers the manifest's SHA-256, and the
    manifest the xxh3 of every file, which the restore verifies: the copy is authenticated end
    to end while only the manifest (kilobytes) is hashed twice, never the state itself."""
    files = json.dumps(header["files"], separators=(",", ":"))
    parts = (
        str(header["job"]),
        str(header["owner"]),
        str(header["step"]),
        files,
        str(header["manifest"]),
        str(header.get("generation", 0)),
    )
    return run_secret.proof(secret, challenge, *parts)


def _checked_header(line: bytes, secret: str, challenge: str, job_id: str) -> dict[str, Any]:
    """The header of a copy once it proved the run's secret; until then nothing is written."""
    if len(line) > MAX_HEADER or not line.endswith(b"\n"):
        raise ValueError("header too long or cut off")
    header = json.loads(line)
    if not isinstance(header, dict) or not all(
        k in header for k in ("job", "owner", "step", "files", "manifest", "manifest_text", "proof")
    ):
        raise ValueError("not a neighbour-copy header")
    if not isinstance(header["proof"], str) or not hmac.compare_digest(
        _proof(secret, challenge, header), header["proof"]
    ):
        raise ValueError("the run's secret was not proved")
    owner, step, files = header["owner"], header["step"], header["files"]
    if header["job"] != job_id:
        raise ValueError(f"a checkpoint of job {header['job']} sent to job {job_id}")
    if not (isinstance(owner, int) and owner >= 0 and isinstance(step, int) and step >= 0):
        raise ValueError("bad owner or step")
    if not isinstance(header.get("generation", 0), int):
        raise ValueError("bad generation")
    if not isinstance(files, list) or not 0 < len(files) <= MAX_FILES:
        raise ValueError("bad file list")
    for entry in files:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], int) and entry[1] >= 0):
            raise ValueError("bad file list")
        _safe_name(entry[0] if isinstance(entry[0], str) else "")
    if files[-1][0] != mf.MANIFEST:
        raise ValueError("a copy without its manifest")
    text = header["manifest_text"]
    if not isinstance(text, str) or not hmac.compare_digest(
        hashlib.sha256(text.encode()).hexdigest(), str(header["manifest"])
    ):
        raise ValueError("the manifest is not the one the header was proved for")
    return header


class NeighbourServer:
    """Receives other nodes' RAM-tier checkpoints into this node's ``neighbour`` root.

    One per rank process (any process of a node can take the node's copies); a thread per
    connection, so a slow sender does not hold up another. Anyone who can reach the port can
    connect; only a sender that answers the challenge with the run's secret gets anything
    written, and a refused connection is logged and closed, never the server's end.
    """

    def __init__(
        self,
        root: Path,
        job_id: str,
        keep: int,
        secret: str,
        host: str = "127.0.0.1",
        generation: Callable[[], int] = lambda: 0,
        cost: CopyCost | None = None,
        local: Path | None = None,
    ) -> None:
        if not run_secret.is_secret(secret):
            raise ValueError("the neighbour server needs the run's secret")
        self.same = SameBits(job_id, local, Path(root))
        """Where a file of a copy may already be, bit for bit (this node's own RAM tier, the
        copies received before): it is linked, not sent."""
        self.cost = cost
        """Where receiving a copy is counted (this node's rank's protection budget): in a ring
        each rank receives about one copy per protected commit, and on a synchronous step a
        receiver's CPU slows every rank as much as a sender's does."""
        self.root, self.job_id, self.keep, self.secret = Path(root), job_id, keep, secret
        self.generation = generation
        """The newest generation this node's rank knows: a copy sent by a rank of an older one
        (cut off from the run and back) is refused before a byte of it is written."""
        self._sock = socket.create_server((host, 0))
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sres-neighbour-server", daemon=True)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        """Copies under way (proven senders only)."""
        self.unproven = UnprovenConnections(MAX_UNPROVEN, HELLO_TIMEOUT_S)
        self.refused: list[str] = []
        """Why connections were refused (the latest 100), for tests and the log."""

    @property
    def link(self) -> NeighbourLink:
        return NeighbourLink(self.address, self.secret)

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
        while not self._stop.is_set() and (conn := self.unproven.accept(self._sock)) is not None:
            threading.Thread(
                target=self._handle, args=(conn,), name="sres-neighbour-recv", daemon=True
            ).start()

    def _refuse(self, why: str) -> None:
        log.warning("neighbour copy refused: %s", why)
        self.refused = [*self.refused[-99:], why]

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._receive(conn)
        except Exception as err:  # noqa: BLE001 - the sender sees the missing "ok"
            self._refuse(str(err) or type(err).__name__)
        finally:
            self.unproven.forget(conn)

    def _receive(self, conn: socket.socket) -> None:
        challenge = run_secret.new_challenge()
        conn.sendall(GREETING + b" " + challenge.encode() + b"\n")
        reader = conn.makefile("rb")
        header = _checked_header(reader.readline(MAX_HEADER + 1), self.secret, challenge, self.job_id)
        self.unproven.proved(conn)
        if header.get("generation", 0) < (newest := self.generation()):
            raise ValueError(f"a copy from generation {header.get('generation', 0)} after {newest} began")
        conn.settimeout(None)
        if not self._slots.acquire(timeout=HELLO_TIMEOUT_S):
            raise ValueError(f"more than {MAX_CONNECTIONS} copies at once")
        try:
            with self.cost.measure(wall=False) if self.cost is not None else contextlib.nullcontext():
                self._store(conn, reader, header)
        finally:
            self._slots.release()
        conn.sendall(b"ok\n")

    def _store(self, conn: socket.socket, reader: Any, header: dict[str, Any]) -> None:
        """Link the files this node holds the same bits of, ask for the others, write the
        manifest last. In pure data parallelism the replicated state, most of a copy, is the
        same on every rank at a step: the next node's own rank has just written it."""
        owner, step = header["owner"], header["step"]
        text: str = header["manifest_text"]
        manifest = mf.Manifest.from_json(text, mf.rank_dir(self.root, step, owner))
        sizes = dict(header["files"][:-1])
        with _staged(mf.rank_dir(self.root, step, owner)) as tmp:
            need = [n for n in sizes if not self.same.link(step, n, manifest.files.get(n), tmp / n)]
            conn.sendall(b"need " + json.dumps(need).encode() + b"\n")
            view = memoryview(bytearray(_CHUNK))  # one buffer for the whole copy
            for name in need:
                with open(tmp / name, "wb") as f:
                    left = sizes[name]
                    while left:
                        n = reader.readinto(view[: min(left, _CHUNK)])
                        if not n:
                            raise ConnectionError("neighbour copy cut off")
                        f.write(view[:n])
                        left -= n
            (tmp / mf.MANIFEST).write_text(text)
        with self._lock:
            prune(self.root, self.keep, owner=owner)


def push_checkpoint(
    link: NeighbourLink,
    src: Path,
    job_id: str,
    owner: int,
    step: int,
    timeout_s: float = 10.0,
    generation: int = 0,
) -> int:
    """Send a checkpoint directory to a neighbour's server; returns the bytes sent. ``timeout_s``
    bounds each wait for progress, not the copy: a neighbour cut off mid-copy (a link gone, no
    reset ever comes) held the lane, and the run's end, for as long as the timeout. Raises
    OSError/ConnectionError when the neighbour did not confirm it, ValueError when what
    answered is not a neighbour server."""
    host, port = link.address.rsplit(":", 1)
    files = _files_of(src)
    if not files or files[-1].name != mf.MANIFEST:
        raise mf.CheckpointInvalid(f"{src} has no manifest")
    header = _header(files, job_id, owner, step, generation)
    data = {p.name: p for p in files[:-1]}
    sent = 0
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        reader = sock.makefile("rb")
        greeting, _, challenge = reader.readline(256).strip().partition(b" ")
        if greeting != GREETING or not challenge:
            raise ValueError(f"{link.address} is not a neighbour server of ours")
        header["proof"] = _proof(link.secret, challenge.decode(), header)
        try:
            sock.sendall(json.dumps(header).encode() + b"\n")
            for name in _needed(reader.readline(MAX_HEADER), data):
                with open(data[name], "rb") as f:
                    sent += sock.sendfile(f)
            sock.shutdown(socket.SHUT_WR)
            reply = reader.readline(16)
        except OSError as err:  # a server that refused the header closes at once, mid-send
            if isinstance(err, ConnectionError) or err.errno == errno.ENOTCONN:
                reply = b""
            else:
                raise
    if reply.strip() != b"ok":
        raise ConnectionError(f"neighbour {link.address} did not confirm step {step} of rank {owner}")
    return sent


def _header(files: list[Path], job_id: str, owner: int, step: int, generation: int) -> dict[str, Any]:
    """What a copy says before its files: the manifest itself among it, so that the receiver
    knows each file's checksum before it asks for any (:class:`SameBits`)."""
    text = files[-1].read_text()
    return {
        "job": job_id,
        "owner": owner,
        "step": step,
        "files": [[p.name, p.stat().st_size] for p in files],
        "manifest": hashlib.sha256(text.encode()).hexdigest(),
        "manifest_text": text,
        "generation": generation,
    }


def _needed(line: bytes, data: dict[str, Path]) -> list[str]:
    """The files the neighbour asked for (``need <JSON list>``), in its order; a server that
    refused the header closed instead (an empty line: nothing to send)."""
    if not line:
        return []
    kind, _, names = line.strip().partition(b" ")
    need = json.loads(names) if kind == b"need" else None
    if not isinstance(need, list) or not all(isinstance(n, str) and n in data for n in need):
        raise ValueError("the neighbour asked for files this copy does not have")
    return need


# --- gloo: transfers during recovery -----------------------------------------------------------


def send_checkpoint(src: Path, dst: int, group: dist.ProcessGroup | None = None) -> int:
    """Send a checkpoint directory to rank ``dst``. A directory that cannot be read is sent as
    an error, so that the receiver fails over to the next tier instead of waiting."""
    try:
        files = [(p.name, p.read_bytes()) for p in _files_of(src)]
        meta = json.dumps({"files": [(name, len(data)) for name, data in files]}).encode()
    except OSError as err:
        files, meta = [], json.dumps({"error": f"{src}: unreadable on the holder ({err})"}).encode()
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
    info = json.loads(meta.numpy().tobytes())
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
