"""The epilog's cleanup of a finished (or requeued) job's RAM tier on one node.

It runs as the job's user, in a child process with a time limit (``slurm_plugins.hooks``), over
a tree that user may change while it is walked: a directory swapped for a link, a FIFO named
``manifest.json``. So every name is opened relative to its parent's descriptor with
``O_NOFOLLOW``, a file is read only when ``fstat`` says it is a regular one (``O_NONBLOCK``:
opening a FIFO does not wait for a writer), and every delete is ``unlinkat``/``rmdir`` relative
to a descriptor: no path through the tree reaches anything outside it.

What stays is what a requeued job needs to restore without going back to the persistent tier.
One node sees only its own copies (and, on a test cluster, its neighbours' on the same host),
so the rule holds per rank: the newest ``keep_ram`` complete steps of every rank seen here, and
the newest step every rank has a complete copy of among the copies seen here. A job cut off
mid-save leaves rank 0 at step 6 and rank 1 at step 5; keeping each node's newest step alone
deleted step 5 of rank 0, the one step every rank could restore. Steps the persistent tier
already holds complete, and everything older, go.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from resilience.contract.tier_config import TierConfig
from resilience.private_paths import NotPrivate, check_private
from resilience.tiers import checkpoint_dirs as dirs
from resilience.tiers.layout import JOB_CONFIG, complete_steps, job_ram_dir, ram_root_of

_SUBS = ("own", "neighbour")
_STEP = re.compile(r"step-(\d+)\Z")
_RANK = re.compile(r"rank-(\d+)\Z")
_SMALL = 1 << 20
"""A manifest or the job's config is far smaller; more is not read."""

Where = tuple[str, str, int]
"""A step directory of one node: (its node directory's name, ``own`` or ``neighbour``, step)."""


@dataclass(frozen=True)
class Copy:
    """One rank's complete checkpoint at one place."""

    where: Where
    rank: int
    world_size: int


def steps_to_keep(copies: Iterable[Copy], keep_per_rank: int, persisted: int) -> set[Where]:
    """The step directories a restore may still need (pure): per rank, its newest
    ``keep_per_rank`` steps; and the newest step complete for every rank; all newer than
    ``persisted``, the newest step the persistent tier holds complete."""
    newer = [c for c in copies if c.where[2] > persisted]
    steps_of: dict[int, set[int]] = {}
    for c in newer:
        steps_of.setdefault(c.rank, set()).add(c.where[2])
    newest = {rank: set(sorted(steps, reverse=True)[:keep_per_rank]) for rank, steps in steps_of.items()}
    keep = {c.where for c in newer if c.where[2] in newest[c.rank]}
    for step in sorted({c.where[2] for c in newer}, reverse=True):
        at = [c for c in newer if c.where[2] == step]
        sizes = {c.world_size for c in at}
        if len(sizes) == 1 and {c.rank for c in at} >= set(range(sizes.pop())):
            return keep | {c.where for c in at}
    return keep


def cleanup_user_job(job_id: str, uid: int) -> bool:
    """:func:`cleanup_job` in each RAM root of user ``uid`` on this node (the usual one and any
    private fallback, ``<root>-*``), skipping any not owned by that user: what the epilog
    runs, as that user. True when something was removed."""
    root = ram_root_of(uid)
    removed = False
    for candidate in [root, *sorted(root.parent.glob(f"{root.name}-*"))]:
        try:
            check_private(candidate, uid)
        except NotPrivate:
            continue
        removed = cleanup_job(job_id, candidate) or removed
    return removed


def cleanup_job(job_id: str, root: Path | None = None) -> bool:
    """Remove a job's RAM-tier files on this node but what a restore may need (see the module
    docstring); True when something was removed."""
    path = job_ram_dir(job_id, root)
    parent = _open_dir(str(path.parent))
    try:
        try:
            job = _open_dir(path.name, parent)
        except FileNotFoundError:
            return False
        except OSError:  # a link or a file where the job's directory belongs: it goes, not its target
            _remove(path.name, parent)
            return True
        try:
            config = _config(job, job_id)
            kept = steps_to_keep(_copies(job, job_id), config.keep_ram, _persisted(config, job_id))
            if kept:
                return _remove_all_but(job, kept)
        finally:
            os.close(job)
        _remove(path.name, parent)
        return True
    finally:
        os.close(parent)


def _config(job: int, job_id: str) -> TierConfig:
    """The job's tier settings as its ranks recorded them; the defaults where none are."""
    try:
        return TierConfig.from_mapping(json.loads(_read_regular(JOB_CONFIG, job) or "null"))
    except (ValueError, TypeError, AttributeError):
        return TierConfig(job_id=job_id)


def _persisted(config: TierConfig, job_id: str) -> int:
    """The newest complete step of the persistent tier, -1 for none or one we cannot read."""
    if not config.persistent_dir:
        return -1
    try:
        return max(complete_steps(Path(config.persistent_dir), job_id), default=-1)
    except (OSError, ValueError):
        return -1


def _copies(job: int, job_id: str) -> Iterator[Copy]:
    for node in _names(job, lambda n: n.startswith("node-")):
        with _Dir(node, job) as node_fd:
            for sub in _names(node_fd, _SUBS.__contains__):
                with _Dir(sub, node_fd) as sub_fd:
                    for step_name in _names(sub_fd, _STEP.match):
                        step = int(step_name[5:])
                        with _Dir(step_name, sub_fd) as step_fd:
                            for rank_name in _names(step_fd, _RANK.match):
                                manifest = _complete(step_fd, rank_name, job_id)
                                if manifest is not None and manifest.step == step:
                                    yield Copy((node, sub, step), manifest.rank, manifest.world_size)


def _complete(step_fd: int, rank_name: str, job_id: str) -> dirs.Manifest | None:
    """A rank directory's manifest when it and every file it names are there, regular and of
    the size it says; else None."""
    with _Dir(rank_name, step_fd) as rank_fd:
        text = _read_regular(dirs.MANIFEST, rank_fd) if rank_fd >= 0 else None
        try:
            manifest = dirs.Manifest.from_json(text or "", Path(rank_name))
        except dirs.CheckpointInvalid:
            return None
        if manifest.job_id != job_id:
            return None
        for name, entry in manifest.files.items():
            owner = manifest.shared.get(name)
            if not _regular_of_size(
                name, entry.size, step_fd, rank_name if owner is None else f"rank-{owner:05d}"
            ):
                return None
        return manifest


def _regular_of_size(name: str, size: int, step_fd: int, rank_name: str) -> bool:
    with _Dir(rank_name, step_fd) as rank_fd:
        try:
            st = os.stat(name, dir_fd=rank_fd, follow_symlinks=False) if rank_fd >= 0 else None
        except OSError:
            return False
        return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size


def _remove_all_but(job: int, kept: set[Where]) -> bool:
    removed = False
    for name in _names(job, lambda n: n != JOB_CONFIG):
        if not any(k[0] == name for k in kept):
            removed |= _remove(name, job)
            continue
        with _Dir(name, job) as node_fd:
            for sub in _names(node_fd, bool):
                if sub not in _SUBS:
                    removed |= _remove(sub, node_fd)
                    continue
                with _Dir(sub, node_fd) as sub_fd:
                    for step_name in _names(sub_fd, bool):
                        match = _STEP.match(step_name)
                        if not (match and (name, sub, int(match.group(1))) in kept):
                            removed |= _remove(step_name, sub_fd)
    return removed


def _remove(name: str, dir_fd: int) -> bool:
    """``name`` under ``dir_fd`` and all below it, never through a link. True if it went."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            with _Dir(name, dir_fd) as fd:
                for child in _names(fd, bool):
                    _remove(child, fd)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False  # gone already, or swapped under us: what it now is stays untouched


def _names(dir_fd: int, wanted) -> list[str]:
    try:
        return sorted(n for n in os.listdir(dir_fd) if wanted(n)) if dir_fd >= 0 else []
    except OSError:
        return []


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


class _Dir:
    """A directory opened relative to ``dir_fd`` without following links; -1 when it cannot
    be (missing, a link, a file): callers then skip it."""

    def __init__(self, name: str, dir_fd: int) -> None:
        self.name, self.dir_fd, self.fd = name, dir_fd, -1

    def __enter__(self) -> int:
        try:
            self.fd = _open_dir(self.name, self.dir_fd) if self.dir_fd >= 0 else -1
        except OSError:
            self.fd = -1
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _read_regular(name: str, dir_fd: int) -> str | None:
    """A small regular file of this user's: its text; None for anything else (a link, a FIFO, a
    device, another user's file)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return f.read(_SMALL).decode(errors="replace")
