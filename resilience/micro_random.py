"""Random ops that are a function of the micro-batch, not of the rank that runs it.

Dropout draws its masks from torch's generator, whose stream belongs to the process: at 1 rank
the step's fourth micro-batch gets the fourth masks of rank 0's stream, at 4 ranks it gets the
first masks of rank 3's. Exact mode (``resilience.ddp(model, exact=True)``) makes the gradient
sum independent of the world size, but not the masks: with dropout the bits still depend on it.

:func:`micro_batch_rng` seeds torch's generators from (a run seed, the step, the micro-batch's
id) for the micro-batch's forward and backward, and gives the surrounding streams back as they
were. :func:`micro_batch_ids` names each micro-batch of ``ElasticSampler`` by the position of its
first sample in the step's global batch: the same samples get the same id at every world size
(where the micro-batches are the same samples, which exact mode needs anyway), and no two
micro-batches of a step share one. Together::

    ids = resilience.micro_batch_ids(ctx.batch, ctx.rank)
    for i, indices in enumerate(sampler.indices(step, ctx.rank, ctx.world_size)):
        with resilience.micro_batch_rng(seed, step, ids[i]):
            loss_of(indices).backward()
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence

import torch

from resilience.elastic import BatchPlan


def micro_batch_ids(plan: BatchPlan, rank: int) -> list[int]:
    """The id of each of ``rank``'s micro-batches of a step split as ``plan`` (``ctx.batch``):
    the position of its first sample in the step's global batch. Pure."""
    first = rank * plan.per_rank
    return [first + sum(plan.micro_batches[:i]) for i in range(plan.accumulation)]


def seed_of(*key: int) -> int:
    """A 63-bit seed that is a function of ``key`` alone (keys close together give unrelated
    seeds, unlike a sum of multiples that two keys can share). Pure."""
    digest = hashlib.blake2b("/".join(str(int(k)) for k in key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def micro_batch_rng(
    seed: int, step: int, micro_batch_id: int, *, devices: Sequence[int] | None = None
) -> Iterator[None]:
    """Inside, torch's random ops (dropout, ``torch.rand``...) draw from a stream seeded by
    (``seed``, ``step``, ``micro_batch_id``) alone; on leaving, the generators are back as they
    were, so the stream around it does not depend on how many micro-batches this rank ran.

    Covers the CPU generator and, once CUDA is initialized, the generators of ``devices``
    (default: the current device). A generator passed to an op explicitly is the caller's.
    """
    if devices is None:
        devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        value = seed_of(seed, step, micro_batch_id)
        torch.default_generator.manual_seed(value)
        for device in devices:
            torch.cuda.default_generators[device].manual_seed(value)
        yield
