"""The batch cache's logic with real files, one process: a rank's batch is the source's, bitwise,
whether it comes from the producer, is made by the rank, or replaces a corrupt entry; the
producer makes what ranks want, nearest step first, and keeps the lookback."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import resilience
from resilience.context import Context
from resilience.data import producer, wants
from resilience.data.batch_link import BatchLink
from resilience.data.batch_store import BatchStore, key_of
from resilience.errors import OptionError


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(i * i)}


class Runtime:
    """The agent's side of ``ctx.register`` for a cache, and the events it sends."""

    def __init__(self, root, producer: bool) -> None:
        self.events: list[tuple[str, dict]] = []
        self.link = BatchLink(root, "job-1", producer, lambda name, **f: self.events.append((name, f)))

    def batch_link(self) -> BatchLink:
        return self.link


def source(workers: int = 0) -> resilience.SampleSource:
    return resilience.SampleSource(Squares(), resilience.ElasticSampler(40, 8, 2, seed=3), workers=workers)


def bound(cache: resilience.BatchCache, runtime: Runtime, rank: int = 0, world: int = 2) -> Context:
    ctx = Context(rank=rank, world_size=world, local_rank=rank, generation=1, step=-1, runtime=runtime)
    ctx.register(batches=cache)
    return ctx


def made(src: resilience.SampleSource, step: int, rank: int, world: int) -> list:
    return src.make(step, src.want(step, rank, world))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b) and a.dtype == b.dtype
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(map(same, a, b))


def serving(src, root, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=producer.serve, args=(src, root, "job-1", stop.is_set), daemon=True)
    thread.start()
    return thread


def test_batches_come_from_the_producer_bitwise_and_the_lookback_stays(tmp_path):
    src, stop = source(), threading.Event()
    runtime = Runtime(tmp_path / "cache", producer=True)
    cache = resilience.BatchCache(source(), prefetch=3, lookback=1)
    bound(cache, runtime)
    thread = serving(src, tmp_path / "cache", stop)
    try:
        for step in range(6):
            assert same(cache.batch(step), made(src, step, 0, 2))
        deadline = time.monotonic() + 10
        while BatchStore(tmp_path / "cache", "job-1").steps() != [4, 5, 6, 7] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert BatchStore(tmp_path / "cache", "job-1").steps() == [4, 5, 6, 7]  # step 5 -1 .. +2
    finally:
        stop.set()
        thread.join(5)
    assert runtime.events == [("first-batch", runtime.events[0][1])]
    assert runtime.events[0][1]["source"] == "cache"


def test_a_corrupt_entry_is_made_again_from_the_source_never_trained_on(tmp_path):
    src = source()
    runtime = Runtime(tmp_path / "cache", producer=False)
    cache = resilience.BatchCache(src, prefetch=2)
    bound(cache, runtime, rank=1)
    store = BatchStore(tmp_path / "cache", "job-1")
    args = src.want(4, 1, 2)
    store.put(4, src.make(4, args), args)
    path = store.path(4, key_of(args))
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x10
    path.write_bytes(bytes(data))
    assert same(cache.batch(4), made(source(), 4, 1, 2))
    assert [name for name, _ in runtime.events] == ["batch-corrupt", "first-batch"]
    assert "checksum mismatch" in runtime.events[0][1]["error"]
    assert store.get(4, key_of(args)) is not None  # whole again


def test_a_resized_world_asks_for_its_own_samples_and_a_rank_makes_what_is_missing(tmp_path):
    src = source()
    runtime = Runtime(tmp_path / "cache", producer=False)
    cache = resilience.BatchCache(src, prefetch=2)
    bound(cache, runtime, rank=0, world=2)
    cache.batch(0)
    bound(cache, runtime, rank=0, world=4)  # a later entry of train, in a world of 4
    reference = source()
    reference.sampler.indices(0, 0, 2)
    assert same(cache.batch(1), reference.make(1, reference.want(1, 0, 4)))
    mine = wants.read(tmp_path / "cache")
    assert [(w.rank, w.step, [x.step for x in w.wants]) for w in mine] == [(0, 1, [1, 2])]


@pytest.mark.local  # forks the producer's workers
def test_the_producer_makes_what_ranks_want_in_its_workers(tmp_path):
    root = tmp_path / "cache"
    src, stop = source(workers=2), threading.Event()
    entries = tuple(wants.Want(s, key_of(src.want(s, 0, 1)), src.want(s, 0, 1)) for s in (3, 2, 1))
    BatchStore(root, "job-1")
    wants.write(wants.folder(root), wants.RankWants(rank=0, step=1, lookback=0, wants=entries))
    thread = serving(src, root, stop)
    deadline = time.monotonic() + 20
    while len(BatchStore(root, "job-1").entries()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5)
    store = BatchStore(root, "job-1")
    assert store.steps() == [1, 2, 3]
    for w in entries:
        cached = store.get(w.step, w.key)
        assert cached is not None and same(cached.batch, src.make(w.step, w.args))


def test_outside_sres_the_cache_is_a_pass_through_and_bad_settings_are_refused():
    cache = resilience.BatchCache(source())
    with pytest.raises(OptionError, match="register it first"):
        cache.batch(0)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=0, step=-1)
    ctx.register(batches=cache)
    assert same(cache.batch(0), made(source(), 0, 0, 1))
    with pytest.raises(OptionError, match="prefetch >= 1"):
        resilience.BatchCache(source(), prefetch=0)
