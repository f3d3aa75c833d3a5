"""Two real gloo ranks as plain processes, for tests of what one process of a pair sees."""

from __future__ import annotations

import socket
import subprocess
import sys


def run_rank_pair(script: str, timeout: float = 90) -> list[subprocess.CompletedProcess]:
    """Run ``script`` (``python -c``) as ranks 0 and 1, with ``sys.argv[1:]`` = rank and a free
    port for their TCPStore (rank 0 hosts it), and wait for both; their outputs, by rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(rank), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
