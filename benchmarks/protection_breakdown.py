"""Where a protected step's background time goes (issue 52, point 2: measure before cutting):
each stage of one commit's trip through the default tiers, timed alone on this machine, next to
the step it competes with. Every number comes from this run.

For each state size (the example MLP's parameters + AdamW state, as in side_by_side.py):
  capture        snapshot.capture into reused buffers (the copy a commit takes; it runs on a
                 background thread, overlapped with the next step)
  checksum       xxh3 of the captured bytes (the RAM-tier file's, computed after writing it)
  RAM file       the RAM tier's checkpoint written to /dev/shm (manifest.write): the file's
                 bytes, its checksum, the manifest; less the checksum, what the write alone costs
  neighbour      the RAM tier's directory pushed over loopback TCP to a NeighbourServer, which
                 writes it into its node's RAM
  neighbour, held  the same push to a node that holds the same bits of that step already (pure
                 data parallelism: its own rank has just written the same replicated state): it
                 links them and receives only the rest (here, with only replicated state, nothing)
  step           the same MLP's forward, backward and AdamW step on one thread, alone
The sum of the background stages against the step is the share of a core that protecting
every step takes; on this 2-core machine it is also roughly what a step gets slower by.

    python benchmarks/protection_breakdown.py [--sizes 60,252] [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.checkpoint import median_time  # noqa: E402
from benchmarks.side_by_side import BATCH, SHAPES  # noqa: E402
from resilience.contract import run_secret  # noqa: E402
from resilience.examples.train_mlp import batch_for, build_model  # noqa: E402
from resilience.state import snapshot  # noqa: E402
from resilience.tiers import manifest as mf  # noqa: E402
from resilience.tiers.transport import NeighbourServer, push_checkpoint  # noqa: E402

STAGES = ("capture", "checksum", "RAM file", "neighbour")
HELD = "neighbour, held"


def trained(size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, float]:
    """The example MLP after a few AdamW steps (its moments exist), and its median step time."""
    width, depth = SHAPES[size]
    model = build_model(width, depth, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int = 0) -> None:
        x, y = batch_for(i, 0, width, BATCH, 0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    step()
    return model, opt, median_time(step, 5)


def bench(size: int, repeat: int) -> dict[str, float]:
    model, opt, step_s = trained(size)
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    snap = snapshot.capture(states, 0)
    out = {"bytes": float(snap.nbytes), "step": step_s}
    out["capture"] = median_time(lambda: snapshot.capture(states, 0, reuse=snap), repeat)
    out["checksum"] = median_time(snap.checksum, repeat)
    ram = Path(tempfile.mkdtemp(prefix="sres-bench-ram-", dir="/dev/shm"))
    peer = Path(tempfile.mkdtemp(prefix="sres-bench-nb-", dir="/dev/shm"))
    server = NeighbourServer(peer, "bench", keep=1, secret=run_secret.new_secret()).start()
    peer_held = Path(tempfile.mkdtemp(prefix="sres-bench-nb-", dir="/dev/shm"))
    held = NeighbourServer(peer_held, "bench", keep=1, secret=run_secret.new_secret(), local=ram).start()
    try:
        steps = iter(range(1, 10**6))
        written: list[Path] = []
        out["RAM file"] = median_time(
            lambda: written.append(mf.write(ram, "bench", next(steps), 1, 0, {"replicated": snap})),
            repeat,
            after=lambda: shutil.rmtree(written[-2], ignore_errors=True) if len(written) > 1 else None,
        )
        source, step = written[-1], len(written)
        out["neighbour"] = median_time(  # nothing held there: each receipt removed after it
            lambda: push_checkpoint(server.link, source, "bench", 0, step),
            repeat,
            after=lambda: shutil.rmtree(mf.step_dir(peer, step), ignore_errors=True),
        )
        out[HELD] = median_time(lambda: push_checkpoint(held.link, source, "bench", 0, step), repeat)
    finally:
        server.stop()
        held.stop()
        shutil.rmtree(peer_held, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)
        shutil.rmtree(peer, ignore_errors=True)
    return out


def report(results: dict[int, dict[str, float]]) -> None:
    sizes = list(results)
    print(
        "| stage, s (median) | " + " | ".join(f"{results[m]['bytes'] / 2**20:.0f} MiB" for m in sizes) + " |"
    )
    print("|---|" + "---|" * len(sizes))
    for name in (*STAGES, HELD, "step"):
        cells = []
        for m in sizes:
            r = results[m]
            rate = f", {r['bytes'] / r[name] / 1e9:.1f} GB/s" if name != "step" else ""
            cells.append(f"{r[name]:.3f}{rate}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for m in sizes:
        r = results[m]
        total = sum(r[name] for name in STAGES)
        write_alone = r["RAM file"] - r["checksum"]
        print(
            f"{r['bytes'] / 2**20:.0f} MiB: {total:.3f} s of background work per protected step, "
            f"{total / r['step']:.2f}x the step ({r['step']:.3f} s) on one core; the RAM file's write "
            f"alone {write_alone:.3f} s, its checksum {r['checksum']:.3f} s; the neighbour push "
            f"{r['neighbour'] / total:.0%} of it; where the next node holds the same bits, "
            f"{total - r['neighbour'] + r[HELD]:.3f} s ({(total - r['neighbour'] + r[HELD]) / total:.0%})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="60,252", help=f"MiB of state, of {sorted(SHAPES)}")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s not in SHAPES for s in sizes):
        parser.error(f"--sizes: each of {sorted(SHAPES)}")
    torch.set_num_threads(1)  # a rank of the side-by-side runs: one thread
    results = {m: bench(m, args.repeat) for m in sizes}
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
