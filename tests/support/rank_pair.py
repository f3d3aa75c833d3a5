"""Real gloo ranks as plain processes, for tests of what each process of a small group sees."""

from __future__ import annotations

import subprocess
import sys

from tests.support.ports import free_range


def run_rank_pair(script: str, timeout: float = 90, ranks: int = 2) -> list[subprocess.CompletedProcess]:
    """Run ``script`` (``python -c``) as ranks 0 to ``ranks - 1``, with ``sys.argv[1:]`` = rank, a
    free port for their TCPStore (rank 0 hosts it) and the world size, and wait for all; their
    outputs, by rank."""
    port = free_range(1)[0]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(rank), str(port), str(ranks)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
