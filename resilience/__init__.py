"""Inside each rank: keeping training state alive across faults (see ARCHITECTURE.md).

import resilience

def train(ctx: resilience.Context) -> None:
    ...
    ctx.register(model=model, optimizer=opt)
    for step in ctx.steps(total_steps):
        ...
        with ctx.commit():
            opt.step(); opt.zero_grad()

resilience.run(train)
"""

from resilience.api import run
from resilience.context import Context
from resilience.ddp import ddp
from resilience.elastic import ElasticSampler
from resilience.exact import ExactDataParallel, GradientNotRepresentable
from resilience.micro_random import micro_batch_ids, micro_batch_rng
from resilience.state.committed import PerRank
from resilience.state.replication import Unrecoverable
from resilience.sharded import ShardedOptimizer

__all__ = [
    "Context",
    "run",
    "ddp",
    "ElasticSampler",
    "ExactDataParallel",
    "GradientNotRepresentable",
    "PerRank",
    "ShardedOptimizer",
    "Unrecoverable",
    "micro_batch_ids",
    "micro_batch_rng",
]
