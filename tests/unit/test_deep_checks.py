"""Deep checks that run anywhere: memory and disk stress, the bandwidth formula, GPU skip."""

from __future__ import annotations

import os

import pytest

from slurm_plugins.allreduce_bench import bus_bandwidth
from slurm_plugins.checks.base import CheckContext, Status
from slurm_plugins.deep import disk_stress, gpu_stress, memory_stress
from slurm_plugins.health_config import DeepConfig, HealthConfig


def ctx(tmp_path) -> CheckContext:
    deep = DeepConfig(memory_mib=8, memory_s=0.2, disk_path=str(tmp_path), disk_mib=4, disk_s=0.5)
    return CheckContext(HealthConfig(deep=deep), "n1")


def test_memory_and_disk_stress_pass_bounded_and_leave_nothing(tmp_path):
    mem = memory_stress(ctx(tmp_path))[0]
    assert mem.status is Status.OK and "8 MiB" in mem.detail
    disk = disk_stress(ctx(tmp_path))[0]
    assert disk.status is Status.OK and "verified" in disk.detail
    assert list(tmp_path.iterdir()) == []


def test_disk_stress_never_writes_through_a_link_planted_in_its_directory(tmp_path):
    """The hook runs as root in a directory users can write: a link named as the old fixed
    file (``.sres-deep-<pid>``) pointing at a file of root's must not be written through."""
    secret = tmp_path / "root-only"
    secret.write_text("keep me")
    disk = tmp_path / "scratch"
    disk.mkdir()
    (disk / f".sres-deep-{os.getpid()}").symlink_to(secret)
    assert disk_stress(ctx(disk))[0].status is Status.OK
    assert secret.read_text() == "keep me"
    assert [p.name for p in disk.iterdir()] == [f".sres-deep-{os.getpid()}"]


def test_disk_stress_on_a_missing_path_fails(tmp_path):
    c = CheckContext(HealthConfig(deep=DeepConfig(disk_path=str(tmp_path / "gone"))), "n1")
    assert disk_stress(c)[0].status is Status.FAIL


def test_gpu_stress_without_a_gpu_is_skipped_never_ok(tmp_path):
    import torch

    result = gpu_stress(ctx(tmp_path))[0]
    assert result.status is (Status.SKIPPED if not torch.cuda.is_available() else Status.OK)


def test_bus_bandwidth_is_nccl_tests_formula():
    algbw, busbw = bus_bandwidth(8 * 10**9, 1.0, 8)
    assert algbw == 8.0 and busbw == 14.0


@pytest.mark.local  # starts two gloo ranks
def test_the_allreduce_check_shows_no_port_to_take_and_meets_in_a_private_directory():
    """A port chosen in advance was on the check's command line, which every user can read
    (``ps``): another user who took it first failed the check and kept a drained node drained."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    argv = ["--world", "2", "--mib", "1", "--seconds", "3"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "slurm_plugins.allreduce_bench", *argv], stdout=subprocess.PIPE, text=True
    )
    lines: list[list[str]] = []
    modes: set[int] = set()
    deadline = time.monotonic() + 60
    while bench.poll() is None and time.monotonic() < deadline and len(lines) < 2:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (proc / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "slurm_plugins.allreduce_bench" in cmd and "--rank" in cmd and cmd not in lines:
                lines.append(cmd)
                modes.add(os.stat(cmd[cmd.index("--store") + 1]).st_mode & 0o777)
        time.sleep(0.05)
    out, _ = bench.communicate(timeout=120)
    assert bench.returncode == 0 and '"correct": true' in out, out
    assert len(lines) == 2 and not any("--port" in cmd for cmd in lines), lines
    assert modes == {0o700}
    store = Path(lines[0][lines[0].index("--store") + 1])
    assert not store.exists()  # removed after the check
