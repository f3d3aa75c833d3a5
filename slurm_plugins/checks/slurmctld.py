"""Can this node reach the controller? A TCP connect to each SlurmctldHost:SlurmctldPort.

The address comes from the slurm.conf that Slurm's own tools use (``$SLURM_CONF``, else
``/etc/slurm/slurm.conf``): a node that cannot reach slurmctld cannot report a job's end.
"""

from __future__ import annotations

import re
import socket
import time

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok, skipped

DEFAULT_PORT = 6817


def controllers(conf_text: str) -> list[tuple[str, int]]:
    """(address, port) of every controller named in slurm.conf text, primary first (pure).

    ``SlurmctldHost=name(addr)`` uses addr; ``SlurmctldPort=6817-6818`` uses its first port;
    the older ``ControlMachine``/``ControlAddr`` spelling is understood too.
    """
    hosts: list[str] = []
    port = DEFAULT_PORT
    control_machine = control_addr = ""
    for raw in conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "slurmctldhost":
            match = re.fullmatch(r"([^()\s]+)(?:\(([^()]+)\))?", value)
            if match:
                hosts.append(match.group(2) or match.group(1))
        elif key == "slurmctldport":
            port = int(value.split("-")[0])
        elif key == "controlmachine":
            control_machine = value
        elif key == "controladdr":
            control_addr = value
    if not hosts and (control_addr or control_machine):
        hosts.append(control_addr or control_machine)
    return [(host, port) for host in hosts]


def check_slurmctld(ctx: CheckContext) -> list[CheckResult]:
    conf = ctx.slurm_conf
    if conf is None or not conf.is_file():
        return [skipped("slurmctld", f"no slurm.conf at {conf}")]
    targets = controllers(conf.read_text(errors="replace"))
    if not targets:
        return [skipped("slurmctld", f"no SlurmctldHost in {conf}")]
    errors = []
    for host, port in targets:
        start = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=ctx.config.checks.slurmctld.timeout_s):
                return [
                    ok("slurmctld", f"{host}:{port} answered in {(time.monotonic() - start) * 1000:.0f} ms")
                ]
        except OSError as err:
            errors.append(f"{host}:{port} {err.strerror or type(err).__name__}")
    # A network problem is often cleared by a reboot (link renegotiated, routes restored).
    return [fail("slurmctld", "unreachable: " + "; ".join(errors), Fault.TRANSIENT)]
