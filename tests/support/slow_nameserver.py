"""Run a command whose every name lookup is answered late: in a network and mount namespace of
its own (``unshare -m -n``, made by the caller), with a loopback of its own, ``/etc/resolv.conf``
replaced there by one naming a nameserver on that loopback, which answers each query "no such
name" after ``--delay-s``, and ``/etc/hosts`` by :func:`plain_hosts`. Nothing outside the namespaces
sees the nameserver or the files.

    unshare -m -n python -m tests.support.slow_nameserver --delay-s 4 -- sres run ...

Why a test needs it: torch's store client formats the address it connects to with
``getnameinfo`` (a reverse lookup, not numeric), and on a machine whose nameserver is slow or drops
a query every connection of a rank to the run's store waits for it (5 s: glibc's timeout).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from launcher.supervisor.name_lookup import look_up

ADDRESS = "127.0.0.53"
"""On the namespace's own loopback: no other process on the machine can be reached there."""


def plain_hosts(machine: str) -> str:
    """The namespace's ``/etc/hosts``: the machine's without lines for ``::ffff:`` addresses, so
    the store's lookups (of ``::ffff:127.0.0.1``) go to the late nameserver whatever the machine's
    file holds, and its own name and ``::1`` still resolve without it (gloo looks the host up)."""
    lines = machine.splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().startswith("::ffff:"))


def serve(sock: socket.socket, delay_s: float) -> None:
    """Answer every query NXDOMAIN (flags 0x8183), each after ``delay_s``, on its own timer so
    that late answers do not queue behind one another."""
    while True:
        query, peer = sock.recvfrom(512)
        answer = query[:2] + b"\x81\x83" + query[4:6] + b"\0\0\0\0\0\0" + query[12:]
        threading.Timer(delay_s, sock.sendto, (answer, peer)).start()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay-s", type=float, required=True, help="how late each answer comes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command to run")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    folder = Path(tempfile.mkdtemp(prefix="sres-resolv-"))
    conf, hosts = folder / "resolv.conf", folder / "hosts"
    conf.write_text(f"nameserver {ADDRESS}\noptions timeout:{int(args.delay_s) + 2} attempts:1\n")
    hosts.write_text(plain_hosts(Path("/etc/hosts").read_text()))
    for mine, theirs in ((conf, "/etc/resolv.conf"), (hosts, "/etc/hosts")):
        subprocess.run(["mount", "--bind", str(mine), theirs], check=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ADDRESS, 53))
    threading.Thread(target=serve, args=(sock, args.delay_s), daemon=True).start()
    took = look_up("10.213.0.1").seconds  # the nameserver is up and late, before the command
    print(f"slow_nameserver: a lookup took {took:.1f} s", file=sys.stderr, flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
