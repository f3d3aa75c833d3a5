"""Random streams of a micro-batch (``resilience.micro_batch_rng``) and the ids that name
micro-batches the same way at every world size (``micro_batch_ids``)."""

from __future__ import annotations

import torch

from resilience.elastic import ElasticSampler
from resilience.micro_random import micro_batch_ids, micro_batch_rng, seed_of


def test_ids_name_the_same_samples_alike_at_every_world_size():
    sampler = ElasticSampler(1000, global_batch=24, micro_batch=2, seed=3)
    named: dict[int, list[int]] = {}
    for world in (1, 2, 3, 4):
        plan = sampler.plan(world)
        for rank in range(world):
            for micro_id, indices in zip(
                micro_batch_ids(plan, rank), sampler.indices(5, rank, world), strict=True
            ):
                assert named.setdefault(micro_id, indices) == indices, (world, rank, micro_id)
    assert sorted(named) == list(range(0, 24, 2))


def test_ids_are_unique_when_the_micro_batch_does_not_divide_a_rank_share():
    plan = ElasticSampler(100, global_batch=12, micro_batch=4).plan(2)  # 6 per rank: micro-batches of 4 and 2
    ids = [i for rank in range(2) for i in micro_batch_ids(plan, rank)]
    assert ids == [0, 4, 6, 10]


def test_the_stream_is_a_function_of_the_key_and_the_surrounding_one_is_untouched():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    with micro_batch_rng(1, 2, 3):
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    torch.rand(10)  # wherever the surrounding stream is
    with micro_batch_rng(1, 2, 3):
        b = torch.rand(4)
    with micro_batch_rng(1, 2, 4):
        c = torch.rand(4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dropout_masks_follow_the_micro_batch():
    layer = torch.nn.Dropout(0.5)
    with micro_batch_rng(0, 9, 6):
        first = layer(torch.ones(64))
    torch.rand(3)
    with micro_batch_rng(0, 9, 6):
        again = layer(torch.ones(64))
    assert torch.equal(first, again)


def test_seeds_of_neighbouring_keys_differ():
    seeds = {seed_of(s, step, k) for s in range(3) for step in range(50) for k in range(0, 48, 2)}
    assert len(seeds) == 3 * 50 * 24 and all(0 <= s < 2**63 for s in seeds)
