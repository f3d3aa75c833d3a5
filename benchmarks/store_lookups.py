"""What a name lookup costs the run's store: torch's ``TCPStore`` looks up the name of the address
at both ends of every new connection (``getnameinfo``, not numeric), the server on its one thread.
Measured: how long a new client's connection takes, and the slowest request another client made
meanwhile, with a nameserver that answers at once and ones that answer late.

    sudo python benchmarks/store_lookups.py            # root: namespaces of its own

Each delay runs in a network and mount namespace of its own (``tests/support/slow_nameserver.py``):
the store on an address outside ``/etc/hosts`` (10.213.7.1 on that namespace's loopback), so each
lookup asks the namespace's nameserver. The first row (answered at once) is the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADDRESS = "10.213.7.1"


def measure() -> dict[str, float]:
    """In the namespace: one client requests in a loop while another connects."""
    import torch.distributed as dist

    listener = socket.create_server((ADDRESS, 0))
    port = listener.getsockname()[1]
    server = dist.TCPStore(
        ADDRESS, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach()
    )
    server.set("k", "v")
    busy = dist.TCPStore(ADDRESS, port, is_master=False, wait_for_workers=False)
    slowest, stop = [0.0], threading.Event()

    def requests() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            busy.get("k")
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.005)

    thread = threading.Thread(target=requests)
    thread.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    dist.TCPStore(ADDRESS, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
    connect_s = time.monotonic() - t0
    time.sleep(0.5)
    stop.set()
    thread.join()
    return {"connect_s": connect_s, "others_slowest_s": slowest[0]}


def in_namespace(delay_s: float) -> dict[str, float]:
    inner = f"ip addr add {ADDRESS}/32 dev lo && {sys.executable} {__file__} --inside"
    cmd = ["unshare", "-m", "-n", sys.executable, "-m", "tests.support.slow_nameserver"]
    cmd += ["--delay-s", str(delay_s), "--", "sh", "-c", inner]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delays", default="0,0.5,2", help="seconds each answer comes late (0: at once)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        print(json.dumps(measure()))
        return 0
    if os.geteuid() != 0:
        print("error: needs root (network and mount namespaces of its own)", file=sys.stderr)
        return 1
    rows = [(float(d), in_namespace(float(d))) for d in args.delays.split(",")]
    base = rows[0][1]
    head = "a new client connects in | another client's slowest request meanwhile | vs first row"
    print(f"| nameserver answers | {head} |")
    print("|---|---|---|---|")
    for delay, got in rows:
        when = "at once" if delay == 0 else f"{delay:g} s late"
        ratio = got["others_slowest_s"] / max(base["others_slowest_s"], 1e-6)
        print(f"| {when} | {got['connect_s']:.3f} s | {got['others_slowest_s']:.3f} s | {ratio:.0f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
