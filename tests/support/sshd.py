"""A real OpenSSH server on loopback for the installer's tests.

One sshd listens on 127.0.0.1-3 (all loopback on Linux), same port; keys are generated per
run. The address 127.0.0.2 accepts only a *different* user key (``Match LocalAddress``), so
that one "node" refuses the installer's key while the others accept it.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_range

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
REFUSING = "127.0.0.2"


@dataclass
class Sshd:
    root: Path
    port: int
    key: Path
    other_key: Path
    known_hosts: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)


def start(root: Path, timeout: float = 20.0) -> Sshd:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "user_key", "other_key"):
        _keygen(root / name)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    (root / "authorized_keys_other").write_text((root / "other_key.pub").read_text())
    port = free_range(1)[0]  # not bind(0): an outgoing connection could take it before sshd
    listen = "\n".join(f"ListenAddress {a}" for a in ADDRESSES)
    (root / "sshd_config").write_text(f"""\
Port {port}
{listen}
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
LogLevel VERBOSE
Match LocalAddress {REFUSING}
    AuthorizedKeysFile {root}/authorized_keys_other
""")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    host_pub = (root / "host_key.pub").read_text().split()[:2]
    (root / "known_hosts").write_text("".join(f"[{a}]:{port} {' '.join(host_pub)}\n" for a in ADDRESSES))
    log = open(root / "sshd.log", "ab")
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(root / "sshd_config")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    sshd = Sshd(root, port, root / "user_key", root / "other_key", root / "known_hosts", proc)
    deadline = time.monotonic() + timeout
    while True:
        try:
            for address in ADDRESSES:
                socket.create_connection((address, port), timeout=1).close()
            return sshd
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sshd.stop()
                raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
