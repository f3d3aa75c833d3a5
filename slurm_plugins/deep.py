"""Deep checks: short stress tests that catch what a status query cannot.

A GPU can report healthy and still produce wrong numbers or a slow interconnect; memory and
disks fail under load. Run by ``sres hooks deep-check`` and by the health-check program
before it returns a drained node to service. Each is bounded in time and runs under the same
runner as the quick checks, so a hang is killed at the budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time

from slurm_plugins.checks.base import Check, CheckContext, CheckResult, Fault, fail, ok, skipped
from resilience.own_python import own_module

MIB = 1 << 20


def gpu_stress(ctx: CheckContext) -> list[CheckResult]:
    """Repeated matmuls on each GPU: results must stay finite and identical."""
    try:
        import torch
    except ImportError:
        return [skipped("gpu_stress", "torch not installed")]
    if not torch.cuda.is_available():
        return [skipped("gpu_stress", "no GPU")]
    seconds = ctx.config.deep.gpu_stress_s
    bad, rates = [], []
    for index in range(torch.cuda.device_count()):
        dev = torch.device(f"cuda:{index}")
        gen = torch.Generator(device=dev).manual_seed(index)
        a = torch.randn(4096, 4096, device=dev, generator=gen)
        b = torch.randn(4096, 4096, device=dev, generator=gen)
        reference = a @ b
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / torch.cuda.device_count():
            c = a @ b
            n += 1
            if n % 10 == 0 and not torch.equal(c, reference):
                bad.append(f"gpu {index}: matmul result changed")
                break
        torch.cuda.synchronize(dev)
        if not torch.isfinite(reference).all():
            bad.append(f"gpu {index}: non-finite results")
        rates.append(2 * 4096**3 * n / (time.perf_counter() - start) / 1e12)
    if bad:
        return [fail("gpu_stress", "; ".join(bad))]
    return [ok("gpu_stress", ", ".join(f"gpu {i}: {r:.1f} TFLOP/s" for i, r in enumerate(rates)))]


def allreduce(ctx: CheckContext) -> list[CheckResult]:
    """Bus bandwidth of an all-reduce across this node's GPUs (NCCL), or CPU ranks (gloo)."""
    cfg = ctx.config.deep
    try:
        import torch
    except ImportError:
        return [skipped("allreduce", "torch not installed")]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, world = ("nccl", gpus) if gpus >= 2 else ("gloo", cfg.allreduce_cpu_procs)
    if world < 2:
        return [skipped("allreduce", "fewer than 2 GPUs and allreduce_cpu_procs < 2")]
    argv = [
        *own_module("slurm_plugins.allreduce_bench"),
        "--world",
        str(world),
        "--mib",
        str(cfg.allreduce_mib),
        "--seconds",
        "2",
        "--backend",
        backend,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [""])[-1][:160]
        return [fail("allreduce", f"{backend} x{world} failed (exit {done.returncode}): {tail}")]
    result = json.loads(lines[-1])
    minimum = cfg.allreduce_min_gbps if backend == "nccl" else cfg.allreduce_cpu_min_gbps
    detail = (
        f"{backend} x{world}, {cfg.allreduce_mib} MiB: bus {result['busbw_gbps']:g} GB/s (min {minimum:g})"
    )
    if not result["correct"]:
        return [fail("allreduce", f"wrong sum; {detail}")]
    if result["busbw_gbps"] < minimum:
        return [fail("allreduce", detail, Fault.TRANSIENT)]
    return [ok("allreduce", detail)]


def memory_stress(ctx: CheckContext) -> list[CheckResult]:
    """Write and verify patterns over ``memory_mib`` for up to ``memory_s`` seconds."""
    cfg = ctx.config.deep
    try:
        buf = bytearray(cfg.memory_mib * MIB)
    except MemoryError:
        return [fail("memory_stress", f"cannot allocate {cfg.memory_mib} MiB", Fault.TRANSIENT)]
    view = memoryview(buf)
    passes, start = 0, time.perf_counter()
    for pattern in (b"\x55", b"\xaa", b"\x00", b"\xff") * 1000:
        view[:] = pattern * len(buf)
        if buf.count(pattern) != len(buf):
            return [fail("memory_stress", f"pattern {pattern.hex()} read back wrong")]
        passes += 1
        if time.perf_counter() - start >= cfg.memory_s:
            break
    rate = passes * 2 * len(buf) / (time.perf_counter() - start) / 1e9
    return [ok("memory_stress", f"{cfg.memory_mib} MiB x {passes} passes, {rate:.1f} GB/s")]


def disk_stress(ctx: CheckContext) -> list[CheckResult]:
    """Write ``disk_mib`` with fsync under ``disk_path``, read it back, compare checksums.

    The file is made by ``mkstemp`` (a new random name, O_EXCL: it never opens what is there)
    and read back through the same descriptor: the hook runs as root in a directory users can
    write (``/tmp``), where a fixed name was a link a user planted to a file of root's."""
    cfg = ctx.config.deep
    block = os.urandom(MIB)
    written = hashlib.sha256()
    start = time.perf_counter()
    n, path = 0, ctx.expand(cfg.disk_path)
    try:
        fd, path = tempfile.mkstemp(prefix=".sres-deep-", dir=path)
        try:
            with os.fdopen(fd, "w+b") as f:
                for n in range(1, cfg.disk_mib + 1):
                    f.write(block)
                    written.update(block)
                    if time.perf_counter() - start >= cfg.disk_s:
                        break
                f.flush()
                os.fsync(f.fileno())
                write_s = time.perf_counter() - start
                f.seek(0)
                read = hashlib.sha256()
                for chunk in iter(lambda: f.read(MIB), b""):
                    read.update(chunk)
        finally:
            os.unlink(path)
    except OSError as err:
        return [fail("disk_stress", f"{path}: {err.strerror or err}")]
    if read.digest() != written.digest():
        return [fail("disk_stress", f"{path}: data read back differs")]
    return [ok("disk_stress", f"{n} MiB written+fsynced at {n / write_s:.0f} MiB/s, verified")]


def deep_checks() -> list[Check]:
    return [
        Check("gpu_stress", gpu_stress, Fault.TRANSIENT),
        Check("allreduce", allreduce, Fault.TRANSIENT),
        Check("memory_stress", memory_stress),
        Check("disk_stress", disk_stress),
    ]
