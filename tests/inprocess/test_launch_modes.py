"""The same training under other launch shapes: several ranks per node, and plain torchrun."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tests.support.sres_runs import STEPS, sres_run


def test_node_with_two_ranks_moves_both_to_the_spare_node(tmp_path, reference):
    run = sres_run(tmp_path, "--procs-per-node", "2", "--spares", "1", "--inject", "node:1:step=5", nodes=2)
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference  # world size 4 either way: same ranks, same math
    assert sorted(f["rank"] for f in run.of("fault")) == [2, 3]
    assert {(e["rank"], e["slot"]) for e in run.of("replaced")} == {(2, "n2p0"), (3, "n2p1")}


def test_plain_torchrun_runs_train_once_with_the_same_result(tmp_path, reference):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-port",
        str(port),
        "-m",
        "resilience.examples.train_mlp",
        "--steps",
        str(STEPS),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-2000:]
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
    assert {r: d["digest"] for r, d in results.items()} == reference
    assert {d["generation"] for d in results.values()} == {0}  # pass-through: no supervisor
