"""GPU decisions on recorded NVML readings (tests/unit/fixtures/nvml): no GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_plugins.checks import CheckContext
from slurm_plugins.checks.base import Fault, Status
from slurm_plugins.checks.gpu import check_gpu, evaluate
from slurm_plugins.checks.nvml import NvmlSnapshot, XidLog, parse_kmsg, read_xids
from slurm_plugins.health_config import GpuConfig, HealthConfig

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
NO_XIDS = XidLog()


def reading(name: str) -> NvmlSnapshot:
    return NvmlSnapshot.from_json(json.loads((FIXTURES / name).read_text()))


def by_check(results):
    return {r.check: r for r in results}


def test_healthy_node_passes_every_gpu_check():
    results = by_check(evaluate(reading("healthy_8x_h100.json"), NO_XIDS, GpuConfig(expected_count=8)))
    assert {k: r.status for k, r in results.items()} == {
        "gpu_count": Status.OK,
        "gpu_ecc": Status.OK,
        "gpu_pages": Status.OK,
        "gpu_xid": Status.OK,
        "gpu_thermal": Status.OK,
        "gpu_nvlink": Status.OK,
    }
    assert results["gpu_nvlink"].detail == "144 links up"


def test_gpu_count_dropped_is_transient():
    r = by_check(evaluate(reading("h100_gpu_count_dropped.json"), NO_XIDS, GpuConfig(expected_count=8)))[
        "gpu_count"
    ]
    assert r.status is Status.FAIL and r.fault is Fault.TRANSIENT and r.detail == "7 of 8 GPUs visible"


def test_gpu_count_falls_back_to_the_pci_bus():
    # No expected_count configured: 8 NVIDIA GPUs on the bus, NVML sees 7 -> one fell off.
    r = by_check(evaluate(reading("h100_gpu_count_dropped.json"), NO_XIDS, GpuConfig()))["gpu_count"]
    assert r.status is Status.FAIL and "7 of 8" in r.detail


def test_uncorrectable_ecc_is_persistent_and_names_the_gpu():
    results = by_check(evaluate(reading("a100_ecc_uncorrectable_remap_pending.json"), NO_XIDS, GpuConfig()))
    assert results["gpu_ecc"].status is Status.FAIL and results["gpu_ecc"].fault is Fault.PERSISTENT
    assert results["gpu_ecc"].detail == "gpu 3: 2 uncorrectable ECC errors"
    assert (
        results["gpu_pages"].fault is Fault.TRANSIENT and "row remap pending" in results["gpu_pages"].detail
    )


def test_ecc_threshold_is_configurable():
    results = by_check(
        evaluate(
            reading("a100_ecc_uncorrectable_remap_pending.json"), NO_XIDS, GpuConfig(ecc_uncorrectable_max=2)
        )
    )
    assert results["gpu_ecc"].status is Status.OK


def test_row_remap_failure_is_persistent():
    r = by_check(evaluate(reading("a100_row_remap_failed.json"), NO_XIDS, GpuConfig()))["gpu_pages"]
    assert (
        r.status is Status.FAIL and r.fault is Fault.PERSISTENT and "gpu 6: row remapping failed" in r.detail
    )


def test_retired_pages_over_the_limit_are_persistent_pending_alone_is_transient():
    over = by_check(evaluate(reading("v100_retired_pages.json"), NO_XIDS, GpuConfig()))["gpu_pages"]
    assert over.fault is Fault.PERSISTENT and "gpu 1: 64 retired pages > 60" in over.detail
    pending = by_check(evaluate(reading("v100_retirement_pending.json"), NO_XIDS, GpuConfig()))["gpu_pages"]
    assert pending.status is Status.FAIL and pending.fault is Fault.TRANSIENT
    assert pending.detail == "gpu 5: page retirement pending (reboot to apply)"
    assert (
        by_check(evaluate(reading("v100_retired_pages.json"), NO_XIDS, GpuConfig(retired_pages_max=100)))[
            "gpu_pages"
        ].fault
        is Fault.TRANSIENT
    )


def test_thermal_slowdown_fails_but_power_cap_is_normal():
    r = by_check(evaluate(reading("h100_thermal_slowdown.json"), NO_XIDS, GpuConfig()))["gpu_thermal"]
    assert r.status is Status.FAIL and r.fault is Fault.TRANSIENT
    assert r.detail == "gpu 2: 92 C >= 90; gpu 2: throttled (hw_thermal_slowdown)"
    assert "gpu 4" not in r.detail  # sw_power_cap is how a busy GPU runs


def test_nvlink_down_and_gpus_without_nvlink_or_ecc():
    r = by_check(evaluate(reading("h100_nvlink_down.json"), NO_XIDS, GpuConfig()))["gpu_nvlink"]
    assert r.status is Status.FAIL and r.detail == "gpu 0: link 5 down; gpu 0: link 11 down"
    l40 = by_check(evaluate(reading("l40s_no_nvlink_no_ecc.json"), NO_XIDS, GpuConfig()))
    assert l40["gpu_nvlink"].status is Status.SKIPPED and l40["gpu_ecc"].status is Status.SKIPPED


def test_xids_since_last_check_from_the_kernel_log(tmp_path):
    records = (FIXTURES / "kmsg_xids.txt").read_text().splitlines()
    events, last = parse_kmsg(records, after_seq=-1)
    assert [(e.xid, e.pci) for e in events] == [
        (13, "PCI:0000:2a:00"),
        (79, "PCI:0000:9a:00"),
        (48, "PCI:0000:18:00"),
    ]
    assert last == 10416
    r = by_check(evaluate(reading("healthy_8x_h100.json"), XidLog(tuple(events)), GpuConfig()))["gpu_xid"]
    assert r.status is Status.FAIL and r.fault is Fault.PERSISTENT  # 48: double bit ECC
    assert r.detail.startswith("XID 79 on PCI:0000:9a:00") and "XID 13" not in r.detail
    only_79 = XidLog(tuple(e for e in events if e.xid == 79))
    assert (
        by_check(evaluate(reading("healthy_8x_h100.json"), only_79, GpuConfig()))["gpu_xid"].fault
        is Fault.TRANSIENT
    )
    assert parse_kmsg(records, after_seq=10414)[0][0].xid == 48  # only what is new since the last check

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(records))
    state = tmp_path / "state" / "xid.state"
    first = read_xids(state, kmsg)
    assert first.readable and json.loads(state.read_text())["last_seq"] == 10416
    assert read_xids(state, kmsg).events == ()


def test_unreadable_kernel_log_is_skipped_not_ok(tmp_path):
    log = read_xids(tmp_path / "xid.state", tmp_path / "missing")
    r = by_check(evaluate(reading("healthy_8x_h100.json"), log, GpuConfig()))["gpu_xid"]
    assert r.status is Status.SKIPPED and "cannot read" in r.detail


def test_without_nvidia_gpus_the_gpu_check_is_skipped_no_nvml():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a dependency: pip install -e .")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip(reason="this machine has NVML: the skip path cannot be seen here")
    except pynvml.NVMLError:
        pass
    results = check_gpu(CheckContext(HealthConfig(), "n1"))
    assert [(r.check, r.status) for r in results] == [("gpu", Status.SKIPPED)]
    assert results[0].detail.startswith("no NVML")
