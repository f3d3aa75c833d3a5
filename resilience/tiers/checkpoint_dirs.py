"""A tier root's directories and the manifest that makes one valid, without torch.

A tier root holds ``step-<S>/rank-<R>/`` directories; each is complete once its
``manifest.json`` (step, job, world size, shard layout, per-file size and checksum) is there and
every file it lists has the size it says. Naming, listing and reading these needs only the
standard library: the epilog (``resilience.tiers.job_cleanup``, run by
``slurm_plugins.hooks`` on every node at every job's end) judges which copies to keep with
this module alone. The state files themselves are :mod:`resilience.tiers.manifest`'s.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from resilience.errors import CheckpointInvalid, OtherJob

FORMAT = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class FileEntry:
    size: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """What a reader checks before it uses a rank's checkpoint."""

    job_id: str
    step: int
    world_size: int
    rank: int
    files: dict[str, FileEntry]
    layout: dict[str, dict[str, int]] = field(default_factory=dict)
    """kind -> dtype -> element count (the shard layout of this rank)."""
    created: float = 0.0
    shared: dict[str, int] = field(default_factory=dict)
    """file name -> rank whose directory of the same step holds that file (its size and
    checksum are still this rank's own, in ``files``)."""
    format: int = FORMAT
    generation: int = 0
    """The generation whose rank wrote it (0: written before manifests carried one). A reader
    takes a step's copies from one generation only: two timelines are never mixed, and a copy
    written late by a rank cut off from a newer generation is never one of its set."""

    def path_of(self, path: Path, name: str) -> Path:
        """Where file ``name`` of the checkpoint directory ``path`` is."""
        owner = self.shared.get(name)
        return Path(path) / name if owner is None else Path(path).parent / f"rank-{owner:05d}" / name

    def sharer_note(self, name: str) -> str:
        """What an error about file ``name`` adds when that file is another rank's."""
        return f" (shared by rank {self.rank})" if name in self.shared else ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: Path) -> "Manifest":
        try:
            data = json.loads(text, parse_constant=_not_finite, parse_float=_finite)
            if data.get("format") != FORMAT:
                raise CheckpointInvalid(f"{where}: unknown manifest format {data.get('format')!r}")
            files = {
                str(n): FileEntry(_count(e["size"]), str(e["checksum"])) for n, e in data["files"].items()
            }
            manifest = cls(
                job_id=str(data["job_id"]),
                step=_count(data["step"]),
                world_size=_count(data["world_size"]),
                rank=int(data["rank"]),
                files=files,
                layout=dict(data.get("layout", {})),
                created=float(data.get("created", 0.0)),
                shared={str(k): _count(v) for k, v in data.get("shared", {}).items()},
                generation=_count(data.get("generation", 0)),
            )
        except CheckpointInvalid:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
            raise CheckpointInvalid(f"{where}: manifest unreadable ({type(err).__name__}: {err})") from None
        if not 1 <= manifest.world_size <= MAX_WORLD or not -1 <= manifest.rank < manifest.world_size:
            raise CheckpointInvalid(
                f"{where}: manifest unreadable (rank {manifest.rank} of world size {manifest.world_size})"
            )
        if not all(_plain_name(name) for name in manifest.files):
            raise CheckpointInvalid(f"{where}: manifest unreadable (a file name that is a path)")
        if any(owner >= manifest.world_size for owner in manifest.shared.values()):
            raise CheckpointInvalid(f"{where}: manifest unreadable (a shared file's rank is not a rank)")
        return manifest


MAX_WORLD = 1 << 24
"""More ranks than any machine has: a manifest that says so is not one of ours."""


def _plain_name(name: str) -> bool:
    """A file of the checkpoint's own directory: ``../../etc/shadow`` in a planted manifest once
    sent ``sres ckpt verify``, run by root, reading outside it."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _finite(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is not a finite number")
    return value


def _not_finite(text: str) -> float:
    raise ValueError(f"{text} is not a number a manifest holds")


def _count(value: object) -> int:
    """A non-negative whole number as written (``3``, never ``3.5``, ``true`` or ``-1``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_dir(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}"


STAGING = ".tmp-"
"""What a rank directory's name is followed by while it is written (then the writer's pid)."""


def staging_dir(final: Path) -> Path:
    """Where this process writes the rank directory ``final`` before renaming it into place:
    named with its pid, so that a reader tells a copy being written from one whose writer died."""
    return final.with_name(f"{final.name}{STAGING}{os.getpid()}")


def staging_pid(name: str) -> int | None:
    """The pid in a staging directory's name (:func:`staging_dir`); None for any other name."""
    _, sep, pid = name.partition(STAGING)
    return int(pid) if sep and pid.isdigit() else None


def steps_in(root: Path) -> list[int]:
    """Steps that have a directory under ``root`` (complete or not), newest first."""
    out = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith("step-") and entry.name[5:].isdigit():
            out.append(int(entry.name[5:]))
    return sorted(out, reverse=True)


def ranks_in(root: Path, step: int) -> list[int]:
    try:
        names = [e.name for e in step_dir(root, step).iterdir()]
    except OSError:
        return []
    return sorted(int(n[5:]) for n in names if n.startswith("rank-") and n[5:].isdigit())


def read_manifest(
    path: Path, job_id: str | None = None, world_size: int | None = None, name: str = MANIFEST
) -> Manifest:
    """The manifest of the checkpoint directory ``path``; raises CheckpointInvalid (naming the
    file) when it is missing, truncated, or belongs to another job or world size, or when a
    listed file is missing or has another size."""
    where = Path(path) / name
    try:
        text = _read_own_regular(where)
    except FileNotFoundError:
        raise CheckpointInvalid(f"{where}: no manifest (checkpoint incomplete)") from None
    except OSError as err:
        raise CheckpointInvalid(f"{where}: unreadable ({err.strerror or err})") from None
    manifest = Manifest.from_json(text, where)
    if name == MANIFEST and not manifest.files:
        raise CheckpointInvalid(f"{where}: lists no state file (not a checkpoint)")
    if job_id is not None and manifest.job_id != job_id:
        raise OtherJob(f"{where}: belongs to job {manifest.job_id}, not {job_id}")
    if world_size is not None and manifest.world_size != world_size:
        raise CheckpointInvalid(f"{where}: written by {manifest.world_size} ranks, this run has {world_size}")
    for name, entry in manifest.files.items():
        where = manifest.path_of(path, name)
        try:
            size = where.stat().st_size
        except OSError:
            raise CheckpointInvalid(f"{where}{manifest.sharer_note(name)}: missing") from None
        if size != entry.size:
            raise CheckpointInvalid(
                f"{where}{manifest.sharer_note(name)}: {size} bytes, the manifest says {entry.size}"
            )
    return manifest


MAX_MANIFEST_BYTES = 16 << 20
"""Far above any manifest written (a few KiB at most): a bigger file is not one."""


def _read_own_regular(where: Path) -> str:
    """A manifest's text, read only when it is a regular file of this user's (opened without
    waiting and without following a link: a FIFO planted under the name must not hang the
    reader, the epilog least of all). A manifest decides what a resume loads and what a prune
    deletes: one another user planted in a shared directory must count for nothing."""
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_uid != os.geteuid():
            raise CheckpointInvalid(
                f"{where}: written by uid {st.st_uid}, not by this user: not read (only the user's "
                "own checkpoints count)"
            )
        if st.st_size > MAX_MANIFEST_BYTES:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, not a manifest")
        return f.read(MAX_MANIFEST_BYTES).decode(errors="replace")
