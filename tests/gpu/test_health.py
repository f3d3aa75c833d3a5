"""The health hooks on a real GPU host: NVML read for real (and kept, as a fixture for the unit
tests of tests/unit/test_gpu_checks.py, which decide on recorded readings), every GPU check's
verdict on it, the matmul stress check's TFLOP/s, and XID records of the host's kernel log where
it can be read."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pynvml  # nvidia-ml-py, a dependency: its absence is the install's fault, not a skip
import pytest

from slurm_plugins.checks import CheckContext
from slurm_plugins.checks.base import Status
from slurm_plugins.checks.gpu import evaluate, xid_result
from slurm_plugins.checks.nvml import XidLog, read_snapshot, read_xids
from slurm_plugins.deep import gpu_stress
from slurm_plugins.health_config import DeepConfig, GpuConfig, HealthConfig

KMSG = Path("/dev/kmsg")


def test_nvml_reads_the_host_and_every_gpu_check_decides_on_it(figures, gpu_out):
    pynvml.nvmlInit()
    try:
        snap = read_snapshot(pynvml)
    finally:
        pynvml.nvmlShutdown()
    fixture = gpu_out / f"nvml_{snap.gpus[0].name.replace(' ', '_').lower()}_{snap.device_count}x.json"
    fixture.write_text(json.dumps(snap.to_json(), indent=1) + "\n")
    figures("nvml reading", snap.to_json())
    assert snap.device_count >= 1 and len(snap.gpus) == snap.device_count
    assert snap.driver, "no driver version read"
    # A GPU passed alone into a VM reports its NVLinks, all inactive: no fault where none is wired.
    links = any(any(g.nvlinks) for g in snap.gpus)
    figures("nvlinks", {g.index: list(g.nvlinks) for g in snap.gpus})
    results = evaluate(snap, XidLog(), GpuConfig(expected_count=snap.device_count, nvlink=links))
    figures("gpu checks", {r.check: [r.status.name, r.detail] for r in results})
    # A lent machine is healthy as far as anyone knows: a check that fails here is ours to read.
    assert all(r.status != Status.FAIL for r in results), results


def test_the_matmul_stress_check_passes_and_reports_its_rate(figures):
    config = dataclasses.replace(HealthConfig(), deep=DeepConfig(gpu_stress_s=5.0))
    [result] = gpu_stress(CheckContext(config=config, node=os.uname().nodename))
    figures("gpu_stress", result.detail)
    assert result.status == Status.OK, result


def test_the_host_s_kernel_log_is_read_for_xids_and_its_verdict_recorded(figures, tmp_path):
    xids = read_xids(tmp_path / "xid-state.json", KMSG)
    figures(
        "kernel log",
        {
            "readable": xids.readable,
            "read_to": xids.last_seq,
            "xids": [e.xid for e in xids.events],
            "notes": xids.notes,
        },
    )
    if not xids.readable:
        why = f"{KMSG} not readable here ({'; '.join(xids.notes)}): the recorded log covers XIDs"
        pytest.skip(reason=why)
    verdict = xid_result(xids, GpuConfig())
    figures("gpu_xid", [verdict.status.name, verdict.detail])
    again = read_xids(tmp_path / "xid-state.json", KMSG)  # from where the first read stopped
    assert again.readable and again.last_seq >= xids.last_seq, again
    assert all(e.seq > xids.last_seq for e in again.events), again
