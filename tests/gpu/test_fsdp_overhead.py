"""FSDP2 on CUDA: the steady cost of sres's protection against the same loop without it.

One GPU holds a world of one: ``fully_shard`` then shards nothing, and there is no buddy to copy
to, so what this shows is the rank's own share of the overhead (capturing every commit from the
device into pinned memory, the RAM tier's write beside training), not the buddy copies over the
network nor NCCL's traffic between ranks, which need two GPUs or more.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import gpu_state
from launcher.supervisor.observe import step_reports
from tests.gpu.cuda_runs import MODULE, ROOT, cuda_run, env, explain, result

SHAPE = ("--fsdp", "--width", "4096", "--depth", "8", "--batch", "8192")
STEPS = 40
ROUNDS = 2


def plain_run(out) -> dict:
    """The loop as ``python train.py`` runs it: resilience.run passes through, no tiers."""
    cmd = [sys.executable, "-m", MODULE, *SHAPE, "--steps", str(STEPS), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "rank0.json").read_text())


def median_blocked_s(log_dir: Path) -> float:
    """The run's own account of what each commit blocked the loop (``step_times.jsonl``), its
    first 2 steps (warm-up, the buffers' allocation) left out."""
    return statistics.median(s["blocked_s"] for s in step_reports.read_file(log_dir) if s["step"] >= 2)


def floor_s(repeat: int = 3) -> float:
    """One copy of a state the loop's size (parameters + AdamW's two moments) into pinned memory,
    the median of ``repeat`` (the state and the buffer made once)."""
    import torch

    width, depth = int(SHAPE[SHAPE.index("--width") + 1]), int(SHAPE[SHAPE.index("--depth") + 1])
    numel = 3 * (depth + 1) * (width * width + width)
    device = torch.device("cuda")
    copy = gpu_state.floor_copy([torch.randn(numel // 8, device=device) for _ in range(8)], device)
    return statistics.median(gpu_state.timed(copy, device) for _ in range(repeat))


def test_fsdp2_on_cuda_steady_step_with_and_without_protection(tmp_path, figures):
    plain, protected, bare, blocked = [], [], [], []
    for i in range(ROUNDS):  # interleaved: each kind sees the same machine
        alone = plain_run(tmp_path / f"plain{i}")
        plain.append(alone["median_step_s"])
        for args, times in (((), protected), (("--no-tiers",), bare)):
            run = cuda_run(tmp_path / f"sres{i}{''.join(args)}", *args, steps=STEPS, train_args=SHAPE)
            assert run.returncode == 0, explain(run)
            assert result(run)["digest"] == alone["digest"], "sres changed the bits of a run without faults"
            times.append(result(run)["median_step_s"])
            if not args:
                blocked.append(median_blocked_s(run.log_dir))
    floor = floor_s()
    figures("blocked per commit inside training (the capture overlapped with the next step)", blocked, "s")
    figures("D2H floor of the same state", floor, "s")
    figures("blocked / D2H floor", statistics.median(blocked) / floor)
    medians = {
        name: statistics.median(v) for name, v in (("plain", plain), ("sres", protected), ("no tiers", bare))
    }
    for name, seconds in medians.items():
        figures(f"median step, {name}", seconds, "s")
    figures("sres / plain", medians["sres"] / medians["plain"])
    figures("sres --no-tiers / plain", medians["no tiers"] / medians["plain"])
