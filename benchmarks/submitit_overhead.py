"""What ``ResilientExecutor`` adds to a submitit job, on a real local Slurm cluster.

Starts its own 5-node cluster (tests/support/slurm_cluster.py; root and slurm-wlm needed; accounting
disabled, as on the test cluster) and submits the same short training (the example MLP, 3
nodes, gloo) two ways, interleaved, timing ``submit`` -> ``job.result()``:
  plain      submitit's SlurmExecutor, 3 tasks, torch.distributed set up by
             ``submitit.helpers.TorchDistributedEnvironment``; rank 0's result
  resilient  launcher.submitit.ResilientExecutor, 3 nodes: the supervisor on the batch host
             starts the ranks as srun steps, with liveness, heartbeats and protected commits
Prints the median and range of each and the difference: our overhead in seconds. Both are
read by ``job.result()``, which polls about once a second: differences below ~1 s are not seen.

    python benchmarks/submitit_overhead.py [--repeat 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import submitit  # noqa: E402
import torch  # noqa: E402

from launcher.submitit import ResilientExecutor  # noqa: E402
from resilience.examples.train_mlp import batch_for, build_model  # noqa: E402
from tests.support.slurm_cluster import SlurmCluster  # noqa: E402

NODES = 3


def plain_train(steps: int) -> int:
    """The example MLP under plain torch.distributed, as a submitit user would write it."""
    import torch.distributed as dist

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # the local cluster's node names do not resolve; all run here
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = build_model(256, 2, seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = batch_for(step, dist.get_rank(), 256, 16, seed=0)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    return steps


def timed(submit) -> float:
    start = time.perf_counter()
    job = submit()
    (job.task(0) if len(job._sub_jobs) > 1 else job).result()
    return time.perf_counter() - start


def main() -> int:
    from resilience.examples.submit_mlp import train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("submitit").setLevel(logging.ERROR)  # plain submitit warns on every sacct poll here
    times: dict[str, list[float]] = {"plain": [], "resilient": []}
    with (
        tempfile.TemporaryDirectory(prefix="sres-bench-submitit-") as tmp,
        SlurmCluster(Path(tmp) / "cluster", node_count=5, slurmd_timeout=10) as cluster,
    ):
        os.environ.update(cluster.env())
        plain = submitit.SlurmExecutor(folder=Path(tmp) / "plain" / "%j")
        plain.update_parameters(nodes=NODES, ntasks_per_node=1, time=10)
        ours = ResilientExecutor(folder=Path(tmp) / "resilient" / "%j", cluster="slurm")
        ours.update_parameters(nodes=NODES, timeout_min=10, no_tiers=True)
        for trial in range(args.repeat):
            for name, submit in (
                ("plain", lambda: plain.submit(plain_train, args.steps)),
                ("resilient", lambda: ours.submit(train, args.steps)),
            ):
                times[name].append(timed(submit))
                print(f"  trial {trial + 1} {name:9s} submit -> result {times[name][-1]:6.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"\nsubmit -> job.result(), {NODES} nodes, {args.steps} steps, median of {args.repeat} "
        f"(2-core machine, 5 local slurmd, gloo)"
    )
    for name, values in times.items():
        print(f"  {name:9s} {med[name]:6.2f} s  ({min(values):.2f}-{max(values):.2f})")
    print(f"  overhead  {med['resilient'] - med['plain']:+6.2f} s  ({med['resilient'] / med['plain']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
