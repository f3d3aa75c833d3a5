"""Network faults: how long a node cut off from the network takes to be seen and replaced, against
a node whose rank dies, and a recovery over a link capped to a tenth of the bandwidth; every
number from this run, the kinds interleaved.

Each run is ``sres run --nodes 2 --spares 1`` of the example MLP (exact mode, 40 steps of at least
``--sleep-s``), its nodes in network namespaces of their own (tests/support/netns.py; root), and
one fault as step ``--fault-at`` begins on node 1:
  dead      its rank SIGKILLed (the baseline: the process's end is seen at once)
  cut       its link set down: nothing refused, packets vanish; the rank hears no echo, fences
            itself after its lease (3/4 of ``--hang-timeout``) and the node is drained unreachable
  dead/10x  as dead, every node's link capped with tbf at ``--slow-mbit`` against ``--fast-mbit``
            (the recovery's state transfer crosses the capped links)
  dead/loss as dead, every node's link losing ``--loss-percent`` of its packets each way (a
            forwarder in each link's path, what ``--inject lossy`` does: this kernel has no netem)
Measured from the fault: detected (its ``fault`` event), back (its ``recovered`` event), and the
run's end against the same run without a fault.

    sudo python benchmarks/network_faults.py [--repeat 3] [--hang-timeout 6]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from resilience.contract.lease import lease_s  # noqa: E402
from tests.support.netns import Network  # noqa: E402
from tests.support.sres_runs import clean_env, slot_pids, sres_command  # noqa: E402

TRAIN = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "2", "--ddp", "exact")


def one(kind: str, args: argparse.Namespace, net: Network, where: Path) -> dict[str, float]:
    log_dir = where / f"{kind.replace('/', '-')}-{time.monotonic_ns()}"
    cmd = sres_command(
        log_dir,
        2,
        ("--spares", "1"),
        "resilience.examples.train_mlp",
        args.steps,
        (*TRAIN, "--sleep-s", str(args.sleep_s)),
        hang_timeout=args.hang_timeout,
    )
    for node in range(3):
        net.slow(node, args.slow_mbit if kind == "dead/10x" else args.fast_mbit)
    links = net.links
    if kind == "dead/loss":
        for node in range(3):
            links.impair(node, loss=args.loss_percent / 100)
    try:
        return _measured(kind, args, net, cmd, log_dir)
    finally:
        for forwarder in links.forwarders.values():  # each puts its link back on the bridge
            forwarder.terminate()
            forwarder.wait(30)
        net.reset()


def _measured(
    kind: str, args: argparse.Namespace, net: Network, cmd: list[str], log_dir: Path
) -> dict[str, float]:
    started = time.time()
    proc = subprocess.Popen(cmd, env=clean_env(SRES_NETNS=net.variable), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    fault_t = None
    if kind != "none":
        path = log_dir / "step_times.jsonl"
        while not (path.exists() and any(json.loads(x)["step"] >= args.fault_at for x in path.open())):
            time.sleep(0.02)
        fault_t = time.time()
        if kind == "cut":
            net.cut(1)
        else:
            for pid in slot_pids(log_dir, "n1p0"):
                os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{kind}: sres run failed: {err[-2000:]}")
    if kind == "cut":
        net.heal(1)
    events = [json.loads(line) for line in (log_dir / "events.jsonl").open()]
    end = next(e["t"] for e in events if e["event"] == "finished")
    out = {"wall": end - started}
    if fault_t is not None:
        out["detected"] = next(e["t"] for e in events if e["event"] == "fault") - fault_t
        out["back"] = next(e["t"] for e in events if e["event"] == "recovered") - fault_t
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fault-at", type=int, default=12)
    p.add_argument("--sleep-s", type=float, default=0.1)
    p.add_argument("--hang-timeout", type=float, default=6.0)
    p.add_argument("--fast-mbit", default="1000")
    p.add_argument("--slow-mbit", default="100")
    p.add_argument("--loss-percent", type=float, default=5.0)
    args = p.parse_args()
    kinds = ("none", "dead", "cut", "dead/10x", "dead/loss")
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="sres-net-bench-") as tmp:
        net = Network(3)
        try:
            net.up()
            for i in range(args.repeat):
                for kind in kinds:
                    results[kind].append(one(kind, args, net, Path(tmp)))
                    print(f"repeat {i + 1}/{args.repeat} {kind}: {results[kind][-1]}", file=sys.stderr)
        finally:
            net.down()
    base = statistics.median(r["wall"] for r in results["none"])
    print(f"\nnetwork faults, 2 ranks + 1 spare, hang timeout {args.hang_timeout:g} s (lease "
          f"{lease_s(args.hang_timeout):g} s), medians of {args.repeat}\n")  # fmt: skip
    print(f"{'fault':<10} {'detected s':>11} {'back s':>8} {'wall s':>8} {'lost vs none s':>15}")
    for kind in kinds:
        rows = results[kind]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        detected = f"{med['detected']:.2f}" if "detected" in med else "-"
        back = f"{med['back']:.2f}" if "back" in med else "-"
        print(f"{kind:<10} {detected:>11} {back:>8} {med['wall']:>8.2f} {med['wall'] - base:>15.2f}")
    dead = statistics.median(r["detected"] for r in results["dead"])
    cut = statistics.median(r["detected"] for r in results["cut"])
    print(f"\ncut / dead detection: {cut / dead:.1f}x ({cut:.2f} s vs {dead:.2f} s)")
    for kind in ("dead/10x", "dead/loss"):
        back = statistics.median(r["back"] for r in results[kind])
        base_back = statistics.median(r["back"] for r in results["dead"])
        print(f"{kind} recovery / dead: {back / base_back:.1f}x ({back:.2f} s vs {base_back:.2f} s)")


if __name__ == "__main__":
    main()
