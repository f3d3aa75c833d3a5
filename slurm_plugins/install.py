"""``sres hooks install``: put the hook wrappers and config on nodes over SSH (paramiko).

Per node, in this order, so that a node is either fully updated or untouched:
1. connect (host key checked against known_hosts unless ``--accept-unknown-hosts``);
2. upload every file into a staging directory next to the install directory;
3. verify there: run each staged wrapper with ``--verify`` against the staged config, which
   proves the interpreter, the package and the config work on that node;
4. only then, per changed file: hard-link the current version to ``<file>.prev`` and rename
   the staged file over it (atomic: Slurm never sees a missing or half-written hook).
A file whose content is already there is left alone, so a second install changes nothing.
Nodes are independent: one refusing our key is reported and the others go on.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.slurm import hostlist
from slurm_plugins import health_config, wrappers
from slurm_plugins.errors import HooksConfigError, InstallError
from slurm_plugins.conf_edit import apply_plugstack_line, apply_slurm_conf_lines, write_with_backup
from slurm_plugins.spank import build as spank_build

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


@dataclass(frozen=True)
class SshOptions:
    user: str = "root"
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    accept_unknown_hosts: bool = False
    timeout_s: float = 20.0


@dataclass
class NodeReport:
    node: str
    ok: bool = False
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    error: str = ""

    def line(self) -> str:
        if not self.ok:
            return f"{self.node}: FAILED: {self.error}; nothing changed there"
        if not self.changed:
            return f"{self.node}: verified, unchanged ({len(self.unchanged)} files already current)"
        return (
            f"{self.node}: verified, installed {', '.join(self.changed)} (previous versions kept as *.prev)"
        )


def install_node(
    host: str, prefix: str, files: Mapping[str, tuple[bytes, int]], ssh: SshOptions
) -> NodeReport:
    """Install ``files`` (relative path -> (content, mode)) under ``prefix`` on ``host``."""
    report = NodeReport(host)
    try:
        client = _connect(host, ssh)
    except InstallError as err:
        report.error = str(err)
        return report
    import paramiko

    staging = f"{prefix.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    try:
        sftp = client.open_sftp()
        try:
            _run(client, f"mkdir -p {shlex.quote(prefix)} {shlex.quote(staging)}", ssh.timeout_s)
            for rel, (content, mode) in files.items():
                _put(client, sftp, f"{staging}/{rel}", content, mode, ssh.timeout_s)
            _verify(client, staging, files, ssh.timeout_s)
            for rel, (content, _mode) in files.items():
                final = f"{prefix}/{rel}"
                if _remote_digest(sftp, final) == hashlib.sha256(content).hexdigest():
                    report.unchanged.append(rel)
                    continue
                _run(client, _keep_previous(final), ssh.timeout_s)
                sftp.posix_rename(f"{staging}/{rel}", final)
                report.changed.append(rel)
            report.ok = True
        finally:
            try:
                _run(client, f"rm -rf {shlex.quote(staging)}", ssh.timeout_s)
            except (InstallError, OSError, paramiko.SSHException):
                pass  # the node's report already says what went wrong
            sftp.close()
    except InstallError as err:
        report.error = str(err)
    except (OSError, EOFError, paramiko.SSHException) as err:
        report.error = f"{type(err).__name__}: {err}"
    finally:
        client.close()
    return report


def _keep_previous(final: str) -> str:
    """The shell command that makes room for ``final`` and keeps its current version as *.prev."""
    path, prev = shlex.quote(final), shlex.quote(final + ".prev")
    return f"mkdir -p {shlex.quote(os.path.dirname(final))} && if [ -e {path} ]; then ln -f {path} {prev}; fi"


def _connect(host: str, ssh: SshOptions):
    import paramiko

    client = paramiko.SSHClient()
    client.load_system_host_keys()
    if ssh.known_hosts:
        try:
            client.load_host_keys(ssh.known_hosts)
        except OSError as err:
            raise InstallError(f"cannot read known_hosts {ssh.known_hosts} ({err.strerror})") from None
    client.set_missing_host_key_policy(
        paramiko.AutoAddPolicy() if ssh.accept_unknown_hosts else paramiko.RejectPolicy()
    )
    where = f"{ssh.user}@{host}:{ssh.port}"
    try:
        client.connect(
            host,
            port=ssh.port,
            username=ssh.user,
            key_filename=ssh.key,
            timeout=ssh.timeout_s,
            banner_timeout=ssh.timeout_s,
            auth_timeout=ssh.timeout_s,
            allow_agent=ssh.key is None,
            look_for_keys=ssh.key is None,
        )
    except paramiko.AuthenticationException:
        client.close()
        key = f" with key {ssh.key}" if ssh.key else ""
        raise InstallError(f"authentication failed for {where}{key}") from None
    except paramiko.BadHostKeyException:
        client.close()
        raise InstallError(
            f"host key of {host} does not match known_hosts (possible man in the middle)"
        ) from None
    except paramiko.SSHException as err:
        client.close()
        hint = (
            " (use --known-hosts or --accept-unknown-hosts)" if "not found in known_hosts" in str(err) else ""
        )
        raise InstallError(f"ssh {where}: {err}{hint}") from None
    except (OSError, socket.timeout) as err:
        client.close()
        raise InstallError(f"cannot connect to {where}: {getattr(err, 'strerror', None) or err}") from None
    return client


def _run(client, command: str, timeout_s: float) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=timeout_s)
    out = stdout.read().decode(errors="replace")
    err = stderr.read().decode(errors="replace")
    code = stdout.channel.recv_exit_status()
    if code != 0:
        last = (err.strip() or out.strip()).splitlines()
        raise InstallError(f"'{command[:80]}' exited {code}" + (f": {last[-1][:200]}" if last else ""))
    return out


def _put(client, sftp, path: str, content: bytes, mode: int, timeout_s: float) -> None:
    _run(client, f"mkdir -p {shlex.quote(os.path.dirname(path))}", timeout_s)
    with sftp.open(path, "wb") as out:
        out.write(content)
    sftp.chmod(path, mode)


def _verify(client, staging: str, files: Mapping[str, tuple[bytes, int]], timeout_s: float) -> None:
    config = f"{staging}/{wrappers.CONFIG_NAME}"
    for rel in wrappers.WRAPPERS:
        if rel not in files:
            continue
        try:
            _run(
                client,
                f"SRES_HEALTH_CONFIG={shlex.quote(config)} {shlex.quote(f'{staging}/{rel}')} --verify",
                timeout_s,
            )
        except InstallError as err:
            raise InstallError(f"verification of {rel} failed: {err}") from None


def _remote_digest(sftp, path: str) -> str | None:
    try:
        with sftp.open(path, "rb") as src:
            return hashlib.sha256(src.read()).hexdigest()
    except OSError:
        return None


# --- the command ---------------------------------------------------------------------------


def _config_text(path: str | None) -> str:
    if path is None:
        return (
            "# sres health hooks: the built-in defaults. See docs/admin/health-checks.md.\n"
            + yaml.safe_dump(health_config.to_dict(health_config.HealthConfig()), sort_keys=False)
        )
    text = Path(path).read_text()
    health_config.parse(health_config.read_raw(Path(path)), path)  # refuse a bad config before any node
    return text


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise HooksConfigError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _spank(path: str | None) -> bytes | None:
    candidate = Path(path) if path else Path(__file__).parent / "spank" / spank_build.PLUGIN
    if candidate.is_file():
        return candidate.read_bytes()
    if path:
        raise HooksConfigError(f"--spank {path}: no such file")
    return None


def main(args: argparse.Namespace) -> int:
    nodes = hostlist.expand(args.nodes)
    if not nodes:
        raise HooksConfigError("--nodes names no node")
    config_text = _config_text(args.config)
    env = _env(args.env)
    spank = _spank(args.spank)
    ssh = SshOptions(
        args.ssh_user, args.port, args.key, args.known_hosts, args.accept_unknown_hosts, args.timeout
    )
    reports = []
    for node in nodes:
        prefix = args.prefix.replace("%n", node)
        files = {
            rel: (text.encode(), mode)
            for rel, (text, mode) in wrappers.node_files(prefix, args.sres, config_text, env).items()
        }
        if spank is not None:
            files[f"spank/{spank_build.PLUGIN}"] = (spank, 0o755)
        started = time.monotonic()
        report = install_node(node, prefix, files, ssh)
        reports.append(report)
        print(f"{report.line()} [{time.monotonic() - started:.1f} s]", flush=True)
    lines = wrappers.slurm_conf_lines(args.prefix, args.interval)
    plug = (
        spank_build.plugstack_line(Path(f"{args.prefix}/spank/{spank_build.PLUGIN}"), args.sres)
        if spank is not None
        else None
    )
    print("\nslurm.conf:\n" + "\n".join(lines))
    if plug:
        print("\nplugstack.conf:\n" + plug)
    failed = [r.node for r in reports if not r.ok]
    if args.apply:
        if failed:
            print("\nnot applied: the hooks are missing on the failed node(s)", file=sys.stderr)
        else:
            _apply(args.slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF, lines, plug)
    if failed:
        print(
            f"sres: error: {len(failed)} of {len(nodes)} node(s) failed: {hostlist.compress(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _apply(conf: str, lines: list[str], plug: str | None) -> None:
    path = Path(conf)
    try:
        before = path.read_text()
    except OSError as err:
        raise HooksConfigError(f"cannot read {conf} ({err.strerror})") from None
    changed, backup = write_with_backup(path, apply_slurm_conf_lines(before, lines))
    print(f"\n{conf}: " + (f"updated (backup {backup})" if changed else "already has these lines"))
    if plug:
        plugstack = _plugstack_path(path, before)
        old = plugstack.read_text() if plugstack.exists() else ""
        changed, backup = write_with_backup(plugstack, apply_plugstack_line(old, plug))
        print(f"{plugstack}: " + (f"updated (backup {backup})" if changed else "already lists the plugin"))
    print("then: scontrol reconfigure")


def _plugstack_path(conf: Path, text: str) -> Path:
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip().lower() == "plugstackconfig":
            return Path(value.strip())
    return conf.parent / "plugstack.conf"
