"""Memory, disk, /dev/shm and mount checks: the node resources a job needs before it starts.

A required mount must be present and, where the config asks, really writable (a file is written
there: permission bits say nothing of a read-only or dead NFS mount); ``%n`` in its path is the
node's name, as in slurm.conf.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok, skipped

MIB = 1 << 20


def mem_available_mib(meminfo: str) -> int | None:
    """``MemAvailable`` from /proc/meminfo text, in MiB (pure)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return None


def check_memory(ctx: CheckContext) -> list[CheckResult]:
    cfg = ctx.config.checks.memory
    try:
        free = mem_available_mib(Path("/proc/meminfo").read_text())
    except OSError as err:
        return [skipped("memory", f"cannot read /proc/meminfo ({err.strerror})")]
    if free is None:
        return [skipped("memory", "no MemAvailable in /proc/meminfo")]
    detail = f"{free} MiB available, need {cfg.min_free_mib}"
    # Memory taken by a leftover process is freed by a reboot.
    return [ok("memory", detail) if free >= cfg.min_free_mib else fail("memory", detail, Fault.TRANSIENT)]


def free_space(name: str, path: str, min_free_mib: int) -> CheckResult:
    """Free space of the filesystem holding ``path`` against a minimum."""
    try:
        usage = shutil.disk_usage(path)
    except OSError as err:
        return fail(name, f"{path}: {err.strerror or err}")
    free = usage.free // MIB
    detail = f"{path}: {free} MiB free, need {min_free_mib}"
    return ok(name, detail) if free >= min_free_mib else fail(name, detail)


def check_disk(ctx: CheckContext) -> list[CheckResult]:
    entries = ctx.config.checks.disk
    if not entries:
        return [skipped("disk", "no paths configured")]
    results = [free_space("disk", ctx.expand(e.path), e.min_free_mib) for e in entries]
    bad = [r for r in results if r.failed]
    if bad:
        return [fail("disk", "; ".join(r.detail for r in bad))]
    return [ok("disk", "; ".join(r.detail for r in results))]


def check_shm(ctx: CheckContext) -> list[CheckResult]:
    """Free space of ``/dev/shm``; a shortfall is transient (usually a dead job's RAM tier: its
    epilog or a reboot clears it). Space in users' files counts as free unless configured:
    see :attr:`~slurm_plugins.health_config.ShmConfig.count_users_files`."""
    cfg = ctx.config.checks.shm
    path = ctx.expand(cfg.path)
    try:
        free = shutil.disk_usage(path).free // MIB
    except OSError as err:
        return [fail("shm", f"{path}: {err.strerror or err}", Fault.TRANSIENT)]
    detail = f"{path}: {free} MiB free, need {cfg.min_free_mib}"
    if free >= cfg.min_free_mib:
        return [ok("shm", detail)]
    held = 0 if cfg.count_users_files else users_bytes(Path(path)) // MIB
    if free + held >= cfg.min_free_mib:
        return [ok("shm", f"{detail}; {held} MiB more in users' files, counted free (any user can fill it)")]
    return [fail("shm", detail + (f" ({held} MiB in users' files counted)" if held else ""), Fault.TRANSIENT)]


def users_bytes(root: Path, limit: int = 100_000) -> int:
    """Bytes held under ``root`` by files not root's, walked without following a link (root
    walks a tree users write: a link or a swap changes only a count) and at most ``limit``
    entries deep in total: a count, never a decision about a file."""
    total, seen, todo = 0, 0, [str(root)]
    while todo and seen < limit:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.is_dir(follow_symlinks=False):
                todo.append(entry.path)
            elif st.st_uid != 0:
                total += st.st_blocks * 512
    return total


def check_mounts(ctx: CheckContext) -> list[CheckResult]:
    mounts = ctx.config.checks.mounts
    if not mounts:
        return [skipped("mounts", "no mounts configured")]
    problems = []
    for mount in mounts:
        path = ctx.expand(mount.path)
        if not os.path.isdir(path):
            problems.append(f"{path} missing")
        elif mount.mountpoint and not os.path.ismount(path):
            problems.append(f"{path} not mounted")
        elif mount.writable and not _writable(path):
            problems.append(f"{path} not writable")
    if problems:
        return [fail("mounts", "; ".join(problems))]
    return [ok("mounts", ", ".join(ctx.expand(m.path) for m in mounts))]


def _writable(path: str) -> bool:
    """Really write: permission bits say nothing about a read-only or dead NFS mount."""
    probe = os.path.join(path, f".sres-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"sres")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError:
        return False
    return True
