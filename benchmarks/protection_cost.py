"""What protection costs a training step: commit blocking with the tiers on, against one memory
copy of the state and against ``dcp.async_save``'s blocking, measured in the same run.

For each state size (the example MLP's parameters and AdamW moments, one rank, ``sres run
--nodes 1``), interleaved, ``--repeat`` times:
  memory copy     one copy of a same-sized state into a preallocated buffer (this process): the
                  floor of any design that copies before the next step may change the state
  dcp.async_save  until the call returns (its staging copy), then its write is waited for
  sres blocked    the median ``blocked_s`` of the run's steps (``step_times.jsonl``): each
                  commit's wait for the previous commit's capture and copies, which run while
                  the next step computes (RAM and persistent tiers, a save every step)
  step overhead   the run's median step time against the same run with ``--no-tiers``
Each step has ``--compute-s`` of simulated accelerator time (the host idle, as on a GPU) on top
of the MLP's own CPU work. Every number is a median over the repeats.

    python benchmarks/protection_cost.py [--sizes 528,2064] [--repeat 5] [--compute-s 2.0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from benchmarks.checkpoint import make_state, nbytes  # noqa: E402
from launcher.supervisor.observe import step_reports  # noqa: E402
from resilience.examples.train_mlp import state_mb  # noqa: E402
from resilience.state import snapshot  # noqa: E402

DEPTH = 4
STEPS = 8
WIDTH_PER_SQRT_MIB = 1024 / 64**0.5
"""The example MLP holds about 64 MiB (parameters and AdamW) at width 1024, depth 4: size grows
with the width squared."""


def width_for(mib: int) -> int:
    return int(WIDTH_PER_SQRT_MIB * mib**0.5)


def mlp_mib(width: int) -> int:
    return round(state_mb(width, DEPTH))


def one_run(work: Path, mib: int, tiers: bool, compute_s: float) -> tuple[float, float]:
    """Median step time and median commit blocking of one ``sres run``, its first 2 steps left out."""
    log_dir = Path(tempfile.mkdtemp(prefix=f"{mib}-{'tiers' if tiers else 'plain'}-", dir=work))
    where = (
        ("--persistent-dir", str(log_dir / "persistent"), "--persist-every", "1")
        if tiers
        else ("--no-tiers",)
    )
    cmd = [
        sys.executable, "-m", "launcher.cli", "run", "--nodes", "1", "--log-dir", str(log_dir), *where, "--",
        sys.executable, "-m", "resilience.examples.train_mlp", "--width", str(width_for(mib)),
        "--depth", str(DEPTH), "--steps", str(STEPS), "--compute-s", str(compute_s),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({log_dir}):\n{done.stderr[-2000:]}")
    steps = [s for s in step_reports.read_file(log_dir) if s["step"] >= 2]
    return statistics.median(s["step_s"] for s in steps), statistics.median(s["blocked_s"] for s in steps)


def baselines(mib: int, work: Path) -> tuple[float, float]:
    """One memory copy and one ``dcp.async_save`` blocking of a ``mib`` state, here."""
    state = make_state(mib)
    _, tensors, _ = snapshot.describe(state)
    floor = torch.empty(nbytes(state) // 4, dtype=torch.float32)

    def plain_copy() -> float:
        started, offset = time.perf_counter(), 0
        for t in tensors:
            floor[offset : offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
        return time.perf_counter() - started

    plain_copy()  # the pages faulted in: the floor is a copy
    copy_s = plain_copy()
    started = time.perf_counter()
    pending = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(work / f"dcp-{mib}"))
    async_s = time.perf_counter() - started
    pending.result()
    return copy_s, async_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="528,2064", help="MiB of state, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--compute-s", type=float, default=2.0)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sres-protection-") as tmp:
        work = Path(tmp)
        for mib in sizes:
            run_mib = mlp_mib(width_for(mib))  # the size the run's MLP really has
            got: dict[str, list[float]] = {k: [] for k in ("copy", "async", "blocked", "tiers", "plain")}
            for i in range(args.repeat):
                copy_s, async_s = baselines(run_mib, work)
                tiers_step, blocked = one_run(work, mib, True, args.compute_s)
                plain_step, _ = one_run(work, mib, False, args.compute_s)
                for key, value in zip(got, (copy_s, async_s, blocked, tiers_step, plain_step)):
                    got[key].append(value)
                print(f"{mib} MiB, repeat {i + 1}/{args.repeat}: blocked {blocked:.4f} s", flush=True)
            rows.append((run_mib, {k: statistics.median(v) for k, v in got.items()}))
    print(
        f"\n{args.compute_s:g} s of simulated accelerator time per step; median of {args.repeat}, interleaved"
    )
    print(
        "| state | memory copy | dcp.async_save blocks | sres blocked per commit | / copy | / async "
        "| step, tiers | step, no tiers | overhead |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mib, m in rows:
        print(
            f"| {mib} MiB | {m['copy']:.3f} s | {m['async']:.3f} s | {m['blocked']:.4f} s | "
            f"{m['blocked'] / m['copy']:.3f}x | {m['blocked'] / m['async']:.3f}x | {m['tiers']:.3f} s | "
            f"{m['plain']:.3f} s | {m['tiers'] / m['plain'] - 1:+.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
