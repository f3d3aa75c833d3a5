"""``sres doctor``: what this machine has, what is missing, and the one-line fix for each.

Each check is a small function returning a :class:`Finding`. Slurm findings count as
failures only where Slurm is needed (inside an allocation, or with ``--slurm``): the
embedded local runner trains without it. :func:`add_parser` adds the subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from launcher.cli.arg_types import finite_float
from launcher.errors import SlurmError
from launcher.slurm.client import SlurmClient, driver_named


class Severity(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    name: str
    status: Severity
    detail: str
    fix: str = ""


MIN_SHM_BYTES = 1 << 30  # The RAM tier keeps a copy of each rank's state in /dev/shm.


def check_python() -> Finding:
    ok = sys.version_info >= (3, 10)
    return Finding(
        "python",
        Severity.OK if ok else Severity.FAIL,
        sys.version.split()[0],
        "" if ok else "use Python 3.10 or newer",
    )


def check_torch() -> Finding:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return Finding(
            "torch", Severity.FAIL, "not installed", "pip install torch (CPU: pip install torch==2.13.0)"
        )
    devices = "cpu"
    if torch.cuda.is_available():
        devices = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    backends = [
        b for b in ("gloo", "nccl") if getattr(torch.distributed, f"is_{b}_available", lambda: False)()
    ]
    return Finding(
        "torch", Severity.OK, f"{torch.__version__}; devices: {devices}; backends: {', '.join(backends)}"
    )


def check_shm(path: str = "/dev/shm") -> Finding:
    if not os.path.isdir(path) or not os.access(path, os.W_OK):
        return Finding("shm", Severity.FAIL, f"{path} missing or not writable", f"mount a tmpfs at {path}")
    usage = shutil.disk_usage(path)
    detail = f"{path}: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB"
    if usage.free < MIN_SHM_BYTES:
        return Finding(
            "shm", Severity.WARN, detail, f"enlarge {path} (the RAM tier keeps each rank's state there)"
        )
    return Finding("shm", Severity.OK, detail)


def check_slurm(client_factory: Callable[[], SlurmClient], needed: bool) -> list[Finding]:
    missing = Severity.FAIL if needed else Severity.INFO
    try:
        client = client_factory()
        version = client.version()
    except SlurmError as err:
        fix = "install slurm-client (needed only to run on Slurm)"
        if "configuration source" in str(err):
            fix = "point SLURM_CONF at the cluster's slurm.conf (or install /etc/slurm/slurm.conf)"
        return [Finding("slurm", missing, str(err), fix)]
    findings = [Finding("slurm", Severity.OK, f"client {version}")]
    try:
        findings.append(Finding("slurmctld", Severity.OK, client.ping()))
    except SlurmError as err:
        findings.append(
            Finding("slurmctld", missing, f"not reachable: {err}", "check SLURM_CONF and that slurmctld runs")
        )
    findings.append(Finding("slurm driver", Severity.OK, f"{client.choice.name} ({client.choice.why})"))
    try:
        findings.append(growth_finding(*client.growth_methods()))
    except SlurmError as err:
        findings.append(Finding("growth", Severity.INFO, f"cannot read slurmctld's configuration: {err}"))
    return findings


def growth_finding(expansion: bool, preempt_type: str) -> Finding:
    """How runs gain nodes here: satellites work on every Slurm; job expansion only where permitted."""
    lending = (
        "lent nodes can be taken back by preemption"
        if preempt_type != "preempt/none"
        else "no preemption configured: lent nodes are never taken back early"
    )
    if expansion:
        return Finding(
            "growth",
            Severity.OK,
            f"satellites (default) and job expansion (--grow-by expansion) both "
            f"work; {preempt_type}: {lending}",
        )
    return Finding(
        "growth",
        Severity.INFO,
        f"job expansion is disabled (the default since Slurm 19.05): runs grow by "
        f"satellites (--grow-by satellite, the default); {preempt_type}: {lending}",
    )


def check_spank(plugstack: str | None) -> Finding:
    """The auto-resume SPANK plugin is optional: ``sres srun`` does the same without it."""
    candidates = [plugstack] if plugstack else ["/etc/slurm/plugstack.conf", "/etc/slurm/plugstack.conf.d"]
    for candidate in candidates:
        path = Path(candidate)
        files = sorted(path.glob("*.conf")) if path.is_dir() else [path]
        for conf in files:
            if conf.is_file() and "auto_resume" in conf.read_text(errors="replace"):
                return Finding("spank", Severity.OK, f"auto_resume plugin listed in {conf}")
    return Finding(
        "spank", Severity.INFO, "auto-resume plugin not installed; use 'sres srun --auto-resume=N'"
    )


def run_checks(
    env: Mapping[str, str], slurm_needed: bool, client_factory: Callable[[], SlurmClient]
) -> list[Finding]:
    findings = [check_python(), check_torch(), check_shm()]
    findings += check_slurm(client_factory, slurm_needed)
    findings.append(check_spank(_plugstack_path(env)))
    return findings


def _plugstack_path(env: Mapping[str, str]) -> str | None:
    conf = env.get("SLURM_CONF")
    if not conf or not os.path.isfile(conf):
        return None
    for line in Path(conf).read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "plugstackconfig":
            return value.strip()
    return str(Path(conf).parent / "plugstack.conf")


def render(findings: list[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        line = f"{f.status.value:>4}  {f.name:<{width}}  {f.detail}"
        if f.fix and f.status in (Severity.FAIL, Severity.WARN):
            line += f"\n      {'':<{width}}  fix: {f.fix}"
        lines.append(line)
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: Slurm, its client driver, torch, /dev/shm, SPANK plugin",
        description="Report what this machine has for resilient training and how to fix what is missing. "
        "Exits 1 when something needed is missing.",
    )
    p.add_argument(
        "--slurm",
        action="store_true",
        help="treat Slurm as needed (it is by default only inside an allocation)",
    )
    p.add_argument(
        "--slurm-driver",
        "--backend",  # the old spelling: "backend" is torch.distributed's (sres run --backend)
        dest="driver",
        choices=["auto", "cli", "pyslurm"],
        default=None,
        help="Slurm client driver (default: $SRES_SLURM_DRIVER, else pyslurm if it matches the cluster, "
        "else cli)",
    )
    p.add_argument(
        "--timeout", type=finite_float, default=10.0, help="seconds per Slurm command (default 10)"
    )
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    needed = args.slurm or bool(os.environ.get("SLURM_JOB_ID"))
    driver = args.driver or driver_named(os.environ)
    findings = run_checks(os.environ, needed, lambda: SlurmClient.create(driver, timeout_s=args.timeout))
    print(render(findings))
    failed = [f for f in findings if f.status is Severity.FAIL]
    if failed:
        print(f"\n{len(failed)} problem(s): {', '.join(f.name for f in failed)}", file=sys.stderr)
        return 1
    return 0
