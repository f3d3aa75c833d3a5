"""One torchft replica group of one process training the example MLP: the torchft side of
``benchmarks/side_by_side.py``. Written as torchft's own examples write it (a ``Manager`` over a
``ProcessGroupGloo``, its ``DistributedDataParallel`` and ``OptimizerWrapper``); the data of a step
is the example's (``batch_for(step, replica)``), so both sides train the same thing.

Each step done appends ``{"step", "t", "committed"}`` to ``--out``; ``--kill-at S`` SIGKILLs this
process as step S begins, after appending ``{"kill": t}``. A replica started again with the same
``--replica-id`` heals: torchft fetches the live state from the other replica (its HTTP transport).

    python benchmarks/torchft_replica.py --replica-id 0 --lighthouse http://HOST:PORT --out F ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo  # noqa: E402
from torchft.optim import OptimizerWrapper  # noqa: E402

from resilience.examples.train_mlp import batch_for, build_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replica-id", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the sres ranks of the same benchmark: one thread a process

    def log(**fields: object) -> None:
        with open(args.out, "a") as f:
            f.write(json.dumps(fields) + "\n")

    model = build_model(args.width, args.depth, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the group's own

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=str(args.replica_id),
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
    )
    ddp = DistributedDataParallel(manager, model)
    wrapped = OptimizerWrapper(manager, opt)
    try:
        while manager.current_step() < args.steps:
            step = manager.current_step()
            if step == args.kill_at:
                log(kill=time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            wrapped.zero_grad()  # starts the quorum (and a heal, for a replica that came back)
            x, y = batch_for(step, args.replica_id, args.width, args.batch, 0)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            wrapped.step()
            log(step=step, t=time.time(), committed=manager.current_step() > step)
    finally:
        manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
