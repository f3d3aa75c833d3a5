"""Reading the GPUs: NVML (``nvidia-ml-py``), the PCI bus and the kernel's XID messages.

Only reading lives here; what a reading means is decided by the pure functions of
:mod:`slurm_plugins.checks.gpu`, which the unit tests drive with recorded readings. Every
NVML query that a GPU generation does not support is recorded as ``None`` ("unknown"), never
as a healthy zero.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NVIDIA_VENDOR = "0x10de"
NVLINK_MAX_LINKS = 18


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    ecc_uncorrectable: int | None = None  # volatile: since the driver loaded
    retired_pages: int | None = None  # single + double bit retirements (pre-Ampere)
    retired_pending: bool | None = None
    remapped_uncorrectable: int | None = None  # row remapping (Ampere and later)
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    temperature_c: float | None = None
    throttle_reasons: int = 0
    nvlinks: tuple[bool, ...] = ()  # one entry per link NVML reports; True = active


@dataclass(frozen=True)
class NvmlSnapshot:
    driver: str
    device_count: int
    gpus: tuple[GpuReading, ...]
    pci_gpus: int | None = None  # NVIDIA display/3D controllers on the PCI bus

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "NvmlSnapshot":
        gpus = tuple(GpuReading(**{**g, "nvlinks": tuple(g.get("nvlinks", ()))}) for g in data["gpus"])
        return cls(data["driver"], int(data["device_count"]), gpus, data.get("pci_gpus"))


@dataclass(frozen=True)
class XidEvent:
    seq: int
    pci: str
    xid: int
    text: str = ""


@dataclass(frozen=True)
class XidLog:
    """XID events since the last check, and where the next check starts reading."""

    events: tuple[XidEvent, ...] = ()
    boot_id: str = ""
    last_seq: int = -1
    readable: bool = True
    notes: tuple[str, ...] = field(default=())


_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)(?:,\s*(.*))?")


def parse_kmsg(records: list[str], after_seq: int) -> tuple[list[XidEvent], int]:
    """XID events in /dev/kmsg records (``prio,seq,usec,flags;text``) newer than ``after_seq``."""
    events, last = [], after_seq
    for record in records:
        head, sep, text = record.partition(";")
        if not sep:
            continue
        try:
            seq = int(head.split(",")[1])
        except (IndexError, ValueError):
            continue
        last = max(last, seq)
        if seq <= after_seq:
            continue
        match = _XID.search(text)
        if match:
            events.append(XidEvent(seq, match.group(1), int(match.group(2)), (match.group(3) or "").strip()))
    return events, last


def read_xids(state_file: Path, kmsg: Path = Path("/dev/kmsg")) -> XidLog:
    """Read new XID messages and remember how far we read (per boot) in ``state_file``."""
    boot_id = _read(Path("/proc/sys/kernel/random/boot_id")).strip()
    after = -1
    try:
        state = json.loads(state_file.read_text())
        if state.get("boot_id") == boot_id:
            after = int(state.get("last_seq", -1))
    except (OSError, ValueError):
        pass
    try:
        records = _read_kmsg(kmsg)
    except OSError as err:
        return XidLog(
            boot_id=boot_id, last_seq=after, readable=False, notes=(f"cannot read {kmsg} ({err.strerror})",)
        )
    events, last = parse_kmsg(records, after)
    notes = ()
    try:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"boot_id": boot_id, "last_seq": last}))
        os.replace(tmp, state_file)
    except OSError as err:
        notes = (f"cannot save {state_file} ({err.strerror})",)
    return XidLog(tuple(events), boot_id, last, True, notes)


def _read_kmsg(path: Path) -> list[str]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten while we read: go on
                    continue
                raise
            if not chunk:
                break
            # One record per read from /dev/kmsg; continuation lines (" KEY=value") are dropped.
            records += [
                line for line in chunk.decode(errors="replace").splitlines() if line and not line[0].isspace()
            ]
    finally:
        os.close(fd)
    return records


def pci_gpu_count(root: Path = Path("/sys/bus/pci/devices")) -> int | None:
    """NVIDIA GPUs the PCI bus shows: more than NVML sees means one fell off the bus."""
    if not root.is_dir():
        return None
    count = 0
    for dev in root.iterdir():
        if _read(dev / "vendor").strip() == NVIDIA_VENDOR and _read(dev / "class").strip()[:6] in (
            "0x0300",
            "0x0302",
        ):
            count += 1
    return count


def read_snapshot(nvml: Any) -> NvmlSnapshot:
    """Read every GPU through an initialised ``pynvml`` module."""
    count = nvml.nvmlDeviceGetCount()
    gpus = tuple(_read_gpu(nvml, i) for i in range(count))
    return NvmlSnapshot(_text(nvml.nvmlSystemGetDriverVersion()), count, gpus, pci_gpu_count())


def _read_gpu(nvml: Any, index: int) -> GpuReading:
    h = nvml.nvmlDeviceGetHandleByIndex(index)

    def q(fn, *args, default=None):
        try:
            return fn(h, *args)
        except nvml.NVMLError:
            return default

    retired = None
    sbe = q(nvml.nvmlDeviceGetRetiredPages, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = q(nvml.nvmlDeviceGetRetiredPages, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    if sbe is not None or dbe is not None:
        retired = len(sbe or ()) + len(dbe or ())
    pending = q(nvml.nvmlDeviceGetRetiredPagesPendingStatus)
    remap = q(nvml.nvmlDeviceGetRemappedRows)  # (corrected, uncorrected, pending, failed)
    links = []
    for link in range(NVLINK_MAX_LINKS):
        state = q(nvml.nvmlDeviceGetNvLinkState, link)
        if state is None:
            break
        links.append(bool(state))
    pci = q(nvml.nvmlDeviceGetPciInfo)
    return GpuReading(
        index=index,
        name=_text(q(nvml.nvmlDeviceGetName, default="")),
        uuid=_text(q(nvml.nvmlDeviceGetUUID, default="")),
        pci_bus_id=_text(getattr(pci, "busId", "")) if pci is not None else "",
        ecc_uncorrectable=q(
            nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
        retired_pages=retired,
        retired_pending=None if pending is None else bool(pending),
        remapped_uncorrectable=None if remap is None else int(remap[1]),
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failed=None if remap is None else bool(remap[3]),
        temperature_c=q(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        throttle_reasons=int(q(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, default=0) or 0),
        nvlinks=tuple(links),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
