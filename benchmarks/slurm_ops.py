"""What the Slurm operations on a recovery path cost, and how late Slurm itself sees a dead node.

Starts its own local cluster (tests/support/slurm_cluster.py; root and slurm-wlm needed), then prints:
1. median latency of each SlurmClient operation used during recovery, next to the bare
   command it wraps (the baseline, measured in the same run);
2. the time from killing a node's slurmd to Slurm reporting it not responding, against
   SlurmdTimeout: the reason the supervisor detects faults itself instead of waiting for Slurm.

    python benchmarks/slurm_ops.py [--repeat 7] [--slurmd-timeout 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.slurm.discovery import discover  # noqa: E402
from launcher.slurm.client import SlurmClient  # noqa: E402
from tests.support.slurm_cluster import SlurmCluster  # noqa: E402


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bare(cluster: SlurmCluster, *argv: str) -> None:
    subprocess.run(argv, env=cluster.env(), capture_output=True, check=True, timeout=30)


def wait_running(client: SlurmClient, job_id: str) -> None:
    while not client.job(job_id).running:
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--slurmd-timeout", type=int, default=10)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="sres-bench-") as tmp,
        SlurmCluster(Path(tmp), node_count=5, slurmd_timeout=args.slurmd_timeout) as cluster,
    ):
        client = SlurmClient.create("cli", env=cluster.env())
        job_id = client.submit(["-N3", "--output=/dev/null", "--wrap", "sleep 600"])
        wait_running(client, job_id)
        job = client.job(job_id)
        spare = job.nodes[-1]

        rows = [
            (
                "list nodes",
                timed(client.nodes, args.repeat),
                "sinfo --json",
                timed(lambda: bare(cluster, "sinfo", "--json"), args.repeat),
            ),
            (
                "show job",
                timed(lambda: client.job(job_id), args.repeat),
                "scontrol -o show job",
                timed(lambda: bare(cluster, "scontrol", "-o", "show", "job", job_id), args.repeat),
            ),
            (
                "discover allocation",
                timed(lambda: discover(client, job_id), args.repeat),
                "scontrol show hostnames",
                timed(
                    lambda: bare(cluster, "scontrol", "show", "hostnames", ",".join(job.nodes)), args.repeat
                ),
            ),
            (
                "drain + resume",
                timed(lambda: (client.drain(spare, "bench"), client.resume(spare)), args.repeat),
                "2 x scontrol update",
                timed(
                    lambda: (
                        bare(
                            cluster, "scontrol", "update", f"nodename={spare}", "state=drain", "reason=bench"
                        ),
                        bare(cluster, "scontrol", "update", f"nodename={spare}", "state=resume"),
                    ),
                    args.repeat,
                ),
            ),
        ]

        client.cancel(job_id)
        # Without slurmdbd a job takes one NodeList shrink, so each sample uses a fresh job.
        shrink_times, grow_times = [], []
        for _ in range(max(3, args.repeat // 2)):
            sample = client.submit(["-N2", "--output=/dev/null", "--wrap", "sleep 600"])
            wait_running(client, sample)
            batch_host = client.job(sample).batch_host
            start = time.perf_counter()
            client.shrink(sample, [batch_host])
            shrink_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            client.grow(sample, 1)
            grow_times.append(time.perf_counter() - start)
            client.cancel(sample)
            cluster.reset()
        rows.append(("shrink (drop 1 node)", statistics.median(shrink_times), "-", float("nan")))
        rows.append(("grow by 1 (expansion)", statistics.median(grow_times), "-", float("nan")))

        print(f"\nSlurmClient operations, median of {args.repeat} (local 5-node cluster, cli backend)")
        print(f"{'operation':<24}{'client s':>10}   {'baseline':<26}{'bare s':>8}{'ratio':>8}")
        for name, ours, base_name, base in rows:
            ratio = f"{ours / base:.2f}x" if base == base else "-"
            base_text = f"{base:.4f}" if base == base else "-"
            print(f"{name:<24}{ours:>10.4f}   {base_name:<26}{base_text:>8}{ratio:>8}")

        victim = cluster.nodes[-1]
        killed = time.monotonic()
        cluster.kill_node(victim)
        while client.node(victim).responding:
            time.sleep(0.25)
        seen = time.monotonic() - killed
        print(
            f"\nslurmd of {victim} killed: Slurm reported it not responding after {seen:.1f} s "
            f"(SlurmdTimeout={args.slurmd_timeout} s; real clusters often use 300 s)"
        )
        print(f"ratio to one client poll of node state: {seen / rows[0][1]:.0f}x")
        cluster.restart_node(victim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
