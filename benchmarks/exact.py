"""What exact mode costs: step time of ``resilience.ddp(model, exact=True)`` vs ``resilience.ddp``
vs stock DDP. Prints tables and ratios; every number comes from this run.

Same model (parameters + AdamW state ~60 MiB per rank), 4 ranks under ``sres run --no-tiers``,
median steady-state step time of rank 0, runs interleaved (this machine is shared and noisy):
  stock       torch's DistributedDataParallel, bucketed all-reduce (``--no-deterministic-ddp``:
              sres would otherwise give it the per-parameter all-reduce)
  resilience  resilience.ddp: one float32 all-reduce per parameter tensor
  exact       resilience.ddp(exact=True): each backward quantized (24 bits), one small int64
              MAX (headers) and one SUM of all gradients per step, as int32 when every sum fits
  exact-32    the same with 32 bits kept per micro-batch: the sums need int64 on the wire
Three workloads: one backward per step, and 4 micro-batches per rank and step (elastic mode)
of 4 and of 32 samples (exact mode's extra work is per parameter and micro-batch, the
model's per sample).
Then what bounds exact mode, measured in one process: quantizing one backward's gradients,
and turning the summed integers back into float gradients.

    python benchmarks/exact.py [--repeat 5] [--width 1024 --depth 4] [--workloads '1 backward/step']
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from resilience import fixed_point  # noqa: E402
from resilience.examples.train_mlp import build_model, state_mb  # noqa: E402

MODES = {
    "stock": ("--ddp", "torch", "--no-deterministic-ddp"),
    "resilience": ("--ddp", "resilience"),
    "exact": ("--ddp", "exact"),
    "exact-32": ("--ddp", "exact", "--exact-bits", "32"),
}
WORKLOADS = {
    "1 backward/step": ("--batch", "16"),
    "4 micro-batches/step": ("--dataset", "100000", "--global-batch", "64", "--micro-batch", "4"),
    "4 micro-b. of 32": ("--dataset", "100000", "--global-batch", "512", "--micro-batch", "32"),
}


def step_time(work: Path, width: int, depth: int, steps: int, mode: str, workload: str) -> float:
    out = work / f"{mode}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "4",
        "--no-tiers",
        "--log-dir",
        str(out),
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--width",
        str(width),
        "--depth",
        str(depth),
        "--steps",
        str(steps),
        "--progress-every",
        "100000",
        "--out",
        str(out / "out"),
        *WORKLOADS[workload],
        *MODES[mode],
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, cwd=ROOT)
    return json.loads((out / "out" / "rank0.json").read_text())["median_step_s"]


def bounds(width: int, depth: int, repeat: int) -> tuple[float, float, int]:
    """Seconds to quantize one backward's gradients and to dequantize the sums, one process."""
    torch.set_num_threads(1)
    model = build_model(width, depth, 0)
    grads = [torch.randn_like(p) for p in model.parameters()]
    slots = [fixed_point.ExactSum(torch.zeros(g.shape, dtype=torch.float64)) for g in grads]
    wires = [torch.empty(g.shape, dtype=torch.int32) for g in grads]
    quantize, dequantize = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        maxima = torch.stack([torch.stack(g.aminmax()).abs().amax() for g in grads]).tolist()
        for slot, g, m in zip(slots, grads, maxima):
            slot.add(g, m, 1)
        quantize.append(time.perf_counter() - start)
        start = time.perf_counter()
        for slot, wire in zip(slots, wires):
            slot.export(wire, slot.low)
            fixed_point.dequantize(wire, slot.low, 4, torch.float32)
            slot.reset()
        dequantize.append(time.perf_counter() - start)
    return statistics.median(quantize), statistics.median(dequantize), sum(g.numel() for g in grads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="a subset of: " + ", ".join(WORKLOADS)
    )
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",")]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload {sorted(unknown)[0]!r}")
    print(
        f"state {state_mb(args.width, args.depth):.0f} MiB per rank (width {args.width}, depth "
        f"{args.depth}), "
        f"4 ranks, gloo on CPU, {args.steps} steps per run, median of {args.repeat} runs",
        flush=True,
    )
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sres-bench-exact-") as tmp:
        for workload in workloads:
            for trial in range(args.repeat):
                for mode in MODES:  # interleaved: a slow minute hits every mode alike
                    t = step_time(Path(tmp), args.width, args.depth, args.steps, mode, workload)
                    results.setdefault((workload, mode), []).append(t)
                    print(
                        f"  {workload:22s} {mode:10s} trial {trial + 1}: {t * 1000:7.1f} ms/step", flush=True
                    )
    print(
        f"\n{'workload':22s} {'mode':10s} {'median ms':>10s} {'range ms':>16s} {'vs resilience':>14s} "
        f"{'vs stock':>9s}"
    )
    for workload in workloads:
        base = {m: statistics.median(results[(workload, m)]) for m in MODES}
        for mode in MODES:
            times = results[(workload, mode)]
            print(
                f"{workload:22s} {mode:10s} {base[mode] * 1000:10.1f} {min(times) * 1000:7.1f} - "
                f"{max(times) * 1000:6.1f} {base[mode] / base['resilience']:13.2f}x "
                f"{base[mode] / base['stock']:8.2f}x"
            )
    quantize, dequantize, numel = bounds(args.width, args.depth, 5)
    print(f"\nWhat bounds exact mode ({numel / 1e6:.1f} M gradient elements, one process, one thread):")
    print(
        f"  quantize one backward's gradients: {quantize * 1000:6.1f} ms  ({numel * 4 / quantize / 1e9:.2f} "
        "GB/s of float32)"
    )
    print(f"  to int32, and back to float32:     {dequantize * 1000:6.1f} ms")
    print(
        f"  all-reduced per step: {numel * 4 / 2**20:.0f} MiB as int32 (when every sum fits 31 bits, as at "
        "24 bits "
        f"here), {numel * 8 / 2**20:.0f} MiB as int64; float32 DDP: {numel * 4 / 2**20:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
