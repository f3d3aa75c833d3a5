"""The files ``sres hooks install`` puts on a node, and the slurm.conf lines that use them.

Wrappers, not bare ``sres hooks prolog`` in slurm.conf, because Slurm runs hooks with almost
no environment (no ``PATH``; the health-check program not even ``SLURM_CONF``), and because
the wrapper pins the config file and the interpreter the node must use. Pure text, so the
installer and the tests share it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath

DEFAULT_PREFIX = "/etc/sres"
CONFIG_NAME = "health.yaml"
WRAPPERS = {"hooks/prolog": "prolog", "hooks/epilog": "epilog", "hooks/healthcheck": "health"}
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def wrapper_text(hook: str, prefix: str, sres_command: str, env: Mapping[str, str]) -> str:
    config = PurePosixPath(prefix) / CONFIG_NAME
    lines = [
        "#!/bin/sh",
        f"# sres health hook '{hook}', written by 'sres hooks install': changes are overwritten.",
        f'SRES_HEALTH_CONFIG="${{SRES_HEALTH_CONFIG:-{config}}}"',
        f'PATH="${{PATH:-{_PATH}}}"',
        "export SRES_HEALTH_CONFIG PATH",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    lines.append(f'exec {sres_command} hooks {hook} "$@"')
    return "\n".join(lines) + "\n"


def node_files(
    prefix: str, sres_command: str, config_text: str, env: Mapping[str, str]
) -> dict[str, tuple[str, int]]:
    """Relative path under ``prefix`` -> (content, mode)."""
    files = {rel: (wrapper_text(hook, prefix, sres_command, env), 0o755) for rel, hook in WRAPPERS.items()}
    files[CONFIG_NAME] = (config_text, 0o644)
    return files


def slurm_conf_lines(prefix: str, interval_s: int = 300) -> list[str]:
    """What slurm.conf needs. ``nohold_on_prolog_fail``: without it Slurm requeues a job whose
    prolog failed *held*, and it never runs elsewhere by itself (merge it into an existing
    ``SchedulerParameters`` line)."""
    p = PurePosixPath(prefix)
    return [
        f"Prolog={p / 'hooks/prolog'}",
        f"Epilog={p / 'hooks/epilog'}",
        f"HealthCheckProgram={p / 'hooks/healthcheck'}",
        f"HealthCheckInterval={interval_s}",
        "HealthCheckNodeState=ANY",
        "SchedulerParameters=nohold_on_prolog_fail",
    ]


def write_local(prefix: str, sres_command: str, config_text: str, env: Mapping[str, str]) -> list[str]:
    """Write the node files on this machine (the test cluster's nodes share it)."""
    import os

    written = []
    for rel, (content, mode) in node_files(prefix, sres_command, config_text, env).items():
        path = os.path.join(prefix, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(content)
        os.chmod(path, mode)
        written.append(path)
    return written
