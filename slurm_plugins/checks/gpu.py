"""GPU checks: pure decisions on an NVML reading, and the check that takes the reading.

The decisions follow what managed GPU clusters act on: fewer GPUs than expected (one fell off
the bus: a reboot may bring it back), uncorrectable ECC errors and retired pages over the
limit (the card needs replacing), retirements or row remaps pending (a reboot applies them),
XID errors since the last check, thermal and power-brake throttling, NVLink links down.
Without NVML (no NVIDIA driver, no GPU) every GPU check is ``skipped: no NVML``, never ok.
"""

from __future__ import annotations

from pathlib import Path

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok, skipped
from slurm_plugins.checks.nvml import NvmlSnapshot, XidEvent, XidLog, read_snapshot, read_xids
from slurm_plugins.health_config import THROTTLE_REASONS, GpuConfig

# XIDs that point at the hardware (replace or service the GPU); others in the fail list are
# driver/firmware states that a reboot clears (79 fell off the bus, 119/120 GSP errors).
PERSISTENT_XIDS = frozenset({48, 63, 64, 74, 92, 94, 95})


def count_result(snap: NvmlSnapshot, cfg: GpuConfig) -> CheckResult:
    expected = cfg.expected_count if cfg.expected_count is not None else snap.pci_gpus
    if expected is None:
        return ok("gpu_count", f"{snap.device_count} GPU(s)")
    if snap.device_count < expected:
        return fail("gpu_count", f"{snap.device_count} of {expected} GPUs visible", Fault.TRANSIENT)
    return ok("gpu_count", f"{snap.device_count} of {expected} GPUs")


def ecc_result(snap: NvmlSnapshot, cfg: GpuConfig) -> CheckResult:
    bad = [
        f"gpu {g.index}: {g.ecc_uncorrectable} uncorrectable ECC errors"
        for g in snap.gpus
        if g.ecc_uncorrectable is not None and g.ecc_uncorrectable > cfg.ecc_uncorrectable_max
    ]
    if bad:
        return fail("gpu_ecc", "; ".join(bad))
    if all(g.ecc_uncorrectable is None for g in snap.gpus):
        return skipped("gpu_ecc", "ECC not reported")
    return ok("gpu_ecc", "no uncorrectable ECC errors")


def pages_result(snap: NvmlSnapshot, cfg: GpuConfig) -> CheckResult:
    persistent, transient = [], []
    for g in snap.gpus:
        if g.remap_failed:
            persistent.append(f"gpu {g.index}: row remapping failed")
        if g.retired_pages is not None and g.retired_pages > cfg.retired_pages_max:
            persistent.append(f"gpu {g.index}: {g.retired_pages} retired pages > {cfg.retired_pages_max}")
        if g.retired_pending:
            transient.append(f"gpu {g.index}: page retirement pending")
        if g.remap_pending:
            transient.append(f"gpu {g.index}: row remap pending")
    if persistent:
        return fail("gpu_pages", "; ".join(persistent + transient))
    if transient:
        return fail("gpu_pages", "; ".join(transient) + " (reboot to apply)", Fault.TRANSIENT)
    return ok("gpu_pages", "no retirement or remap pending")


def xid_result(xids: XidLog, cfg: GpuConfig) -> CheckResult:
    if not xids.readable:
        return skipped("gpu_xid", "; ".join(xids.notes) or "kernel log not readable")
    bad = [e for e in xids.events if e.xid in cfg.xid_fail]
    if not bad:
        seen = f" ({len(xids.events)} ignored)" if xids.events else ""
        return ok("gpu_xid", f"no critical XID since last check{seen}")
    fault = Fault.PERSISTENT if any(e.xid in PERSISTENT_XIDS for e in bad) else Fault.TRANSIENT
    return fail("gpu_xid", "; ".join(_xid_text(e) for e in bad[:4]), fault)


def thermal_result(snap: NvmlSnapshot, cfg: GpuConfig) -> CheckResult:
    mask = 0
    for name in cfg.fail_throttle_reasons:
        mask |= THROTTLE_REASONS[name]
    bad = []
    for g in snap.gpus:
        if g.temperature_c is not None and g.temperature_c >= cfg.max_temperature_c:
            bad.append(f"gpu {g.index}: {g.temperature_c:g} C >= {cfg.max_temperature_c:g}")
        reasons = [n for n, bit in THROTTLE_REASONS.items() if g.throttle_reasons & bit & mask]
        if reasons:
            bad.append(f"gpu {g.index}: throttled ({', '.join(reasons)})")
    if bad:
        return fail("gpu_thermal", "; ".join(bad), Fault.TRANSIENT)
    temps = [g.temperature_c for g in snap.gpus if g.temperature_c is not None]
    return ok("gpu_thermal", f"max {max(temps):g} C" if temps else "no temperature reported")


def nvlink_result(snap: NvmlSnapshot, cfg: GpuConfig) -> CheckResult:
    if not cfg.nvlink or not any(g.nvlinks for g in snap.gpus):
        return skipped("gpu_nvlink", "no NVLink" if cfg.nvlink else "disabled")
    down = [f"gpu {g.index}: link {i} down" for g in snap.gpus for i, up in enumerate(g.nvlinks) if not up]
    if down:
        return fail("gpu_nvlink", "; ".join(down[:6]), Fault.TRANSIENT)
    return ok("gpu_nvlink", f"{sum(len(g.nvlinks) for g in snap.gpus)} links up")


def evaluate(snap: NvmlSnapshot, xids: XidLog, cfg: GpuConfig) -> list[CheckResult]:
    """Every GPU decision on one reading (pure)."""
    return [
        count_result(snap, cfg),
        ecc_result(snap, cfg),
        pages_result(snap, cfg),
        xid_result(xids, cfg),
        thermal_result(snap, cfg),
        nvlink_result(snap, cfg),
    ]


def check_gpu(ctx: CheckContext) -> list[CheckResult]:
    cfg = ctx.config.checks.gpu
    try:
        import pynvml
    except ImportError:
        return [skipped("gpu", "no NVML (nvidia-ml-py not installed)")]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return [skipped("gpu", f"no NVML ({err})")]
    try:
        snap = read_snapshot(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return evaluate(snap, read_xids(Path(cfg.xid_state_file)), cfg)


def _xid_text(event: XidEvent) -> str:
    tail = f" {event.text}" if event.text else ""
    return f"XID {event.xid} on {event.pci}{tail}"[:120]
