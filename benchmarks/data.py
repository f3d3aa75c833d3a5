"""What the batch cache (issue 33) buys and costs: ``resilience.BatchCache`` with the node's
producer vs torch's ``DataLoader``, on one machine, every number from this run.

The data: a synthetic map-style dataset whose ``__getitem__`` waits ``--sample-ms`` (5 ms: a read,
a decode) and returns a ``3 x --image x --image`` uint8 image and its label; a rank's batch is
``--batch`` samples per step (``ElasticSampler``, ``--ranks`` ranks on the node), the same samples
on both sides (checked: bitwise). Each step's batch is copied into one preallocated buffer (as to
an accelerator). The loaders' workers are forked (``multiprocessing_context="fork"``: Linux's
default before Python 3.14; this script's rank processes are spawned and would spawn them too).
The producer runs ``resilience.data.producer.serve`` in a spawned process of its own and is ended
as the supervisor ends one (SIGKILL to it and its workers).

1. First batch after a rank restart. In a new process (spawned: a rank restarted), after its
   imports, from building the dataset and sampler (trivial here) to having copied step S's batch:
     cache   BatchCache + Context + ``ctx.register`` + ``cache.batch(S)``, while the node's producer
             (``--workers`` workers) has prefetched S..S+prefetch-1: a rank 0 stepped to S-1 before
             (in this script's process), so the entries are there; checked: from the cache
     loader  ``DataLoader(dataset, batch_sampler=<steps S..>, num_workers=--workers)`` and its first
             batch, worker start-up included (no producer runs meanwhile)
   Python's and torch's imports are in neither time (the same for both).
2. Memory per node with ``--ranks`` ranks, at its peak while they step ``--mem-steps`` steps (and,
   for the cache, once its window is full: ``prefetch + lookback`` steps of every rank). Counted:
   the anonymous memory of every process taking part (``Pss_Anon`` of /proc/<pid>/smaps_rollup:
   PSS, so a page shared after a fork counts once in all), plus each shared-memory object once,
   by its blocks: the /dev/shm objects those processes hold open or map (a loader's batches,
   in flight or received) and the cache's files (mapped by the ranks, or by no one). Not counted:
   the libraries' code (file pages every torch process shares).
     loader  one rank process with its ``DataLoader(num_workers=--workers, prefetch_factor=2)``:
             its growth from before the DataLoader, its workers included, times ``--ranks``
     cache   the cache's files, the producer process (all its anonymous memory: it exists for
             the cache alone), its workers' own pages (those no longer shared with it), and the
             growth of one process that steps every rank's cache.
             The producer has ``--producer-workers`` workers (default: ranks x workers, the
             loaders' throughput: ``--workers`` workers cannot make ``--ranks`` ranks' batches of
             80 ms each 50 ms step). The brief's measure, the cache's files alone against the
             loaders, is the "cache files" row
3. Steady-state step time, one rank (rank 0 of ``--ranks``): get the batch, copy it, sleep
   ``--step-ms`` (the accelerator); mean over ``--steps`` steps after ``--warmup``, runs
   interleaved (this machine is shared and noisy), median of ``--repeat``:
     loader  an iterator of a DataLoader with ``--workers`` workers (no producer runs meanwhile)
     cache   ``cache.batch(step)`` with a producer of ``--workers`` workers
   Also: the CPU the rank spends per step (get + copy + the cache's bookkeeping), and the
   producer's own process's CPU (its loop; its workers' work is the loaders' workers' work) as a
   share of one core.

    python benchmarks/data.py [--repeat 3] [--steps 100] [--step-ms 50] [--sample-ms 5] [--image 224]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import shutil
import signal
import stat
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import resilience  # noqa: E402
from resilience.context import Context  # noqa: E402
from resilience.data import producer  # noqa: E402
from resilience.data.batch_link import BatchLink  # noqa: E402
from resilience.data.batch_store import BatchStore, key_of  # noqa: E402

JOB = "bench-data"
SPAWN = multiprocessing.get_context("spawn")
warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: asked for
MiB = 2**20


@dataclass(frozen=True)
class Config:
    samples: int
    image: int
    sample_ms: float
    batch: int
    micro: int
    ranks: int
    workers: int
    producer_workers: int
    prefetch: int
    lookback: int
    step_ms: float


class Images(Dataset):
    """``samples`` images, each ``sample_ms`` of waiting and then made: a uint8 image and its label."""

    def __init__(self, cfg: Config) -> None:
        self.n, self.size, self.wait_s = cfg.samples, cfg.image, cfg.sample_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        time.sleep(self.wait_s)
        return {"image": torch.full((3, self.size, self.size), i % 251, dtype=torch.uint8), "label": i}


def sampler(cfg: Config) -> resilience.ElasticSampler:
    return resilience.ElasticSampler(cfg.samples, cfg.batch * cfg.ranks, cfg.micro, seed=0)


class StepBatches:
    """The DataLoader's batch sampler: a rank's samples of steps ``first..last-1``, the ones the
    cache's source names (its micro-batches in one batch)."""

    def __init__(self, cfg: Config, first: int, last: int, rank: int = 0) -> None:
        self.sampler, self.world = sampler(cfg), cfg.ranks
        self.first, self.last, self.rank = first, last, rank

    def __len__(self) -> int:
        return self.last - self.first

    def __iter__(self):
        for step in range(self.first, self.last):
            yield [i for micro in self.sampler.indices(step, self.rank, self.world) for i in micro]


def loader(cfg: Config, first: int, last: int) -> DataLoader:
    return DataLoader(
        Images(cfg),
        batch_sampler=StepBatches(cfg, first, last),
        num_workers=cfg.workers,
        prefetch_factor=2,
        multiprocessing_context="fork",  # Linux's default (before Python 3.14); not this process's: spawned
    )


class Runtime:
    """The agent's side of ``ctx.register`` for a cache: the node's cache and a producer serving it."""

    def __init__(self, root: Path) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.link = BatchLink(root, JOB, True, lambda name, **fields: self.events.append((name, fields)))

    def batch_link(self) -> BatchLink:
        return self.link


def bound(cfg: Config, root: Path, rank: int) -> tuple[resilience.BatchCache, Runtime]:
    cache = resilience.BatchCache(
        resilience.SampleSource(Images(cfg), sampler(cfg)), prefetch=cfg.prefetch, lookback=cfg.lookback
    )
    runtime = Runtime(root)
    ctx = Context(rank=rank, world_size=cfg.ranks, local_rank=rank, generation=1, step=-1, runtime=runtime)
    ctx.register(batches=cache, sampler=cache.sampler)
    return cache, runtime


class Sink:
    """Where a step's batch goes: copied into one preallocated buffer, as to an accelerator."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, batch: Any) -> None:
        tensors = list(tensors_of(batch))
        total = sum(t.numel() * t.element_size() for t in tensors)
        if self.buffer.numel() < total:
            self.buffer = torch.empty(total, dtype=torch.uint8)
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            self.buffer[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
            offset += n


def tensors_of(batch: Any):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from tensors_of(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from tensors_of(value)


# --- processes: the producer, a restarted rank, ranks whose memory is measured ---------------------


def serve(cfg: Config, root: str, workers: int) -> None:
    torch.set_num_threads(1)
    source = resilience.SampleSource(Images(cfg), sampler(cfg), workers=workers)
    producer.serve(source, Path(root), JOB)


class Producer:
    """The node's producer, a process of its own (spawned), with ``workers`` forked workers. Ended
    as the supervisor ends one: SIGKILL to it and its workers (``serve(stop=...)`` returning in a
    multiprocessing child hangs at its exit: its pool's workers never get their sentinels)."""

    def __init__(self, cfg: Config, root: Path, workers: int) -> None:
        self.process = SPAWN.Process(target=serve, args=(cfg, str(root), workers))

    def __enter__(self) -> Producer:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for pid in reversed(tree(self.process.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.join(10)


def restarted_cache(cfg: Config, root: str, step: int, out: Any) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    cache, runtime = bound(cfg, Path(root), 0)
    Sink().take(cache.batch(step))
    seconds = time.perf_counter() - start
    out.put((seconds, runtime.events[0][1]["source"]))


def restarted_loader(cfg: Config, step: int, out: Any) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    batches = iter(loader(cfg, step, step + 1000))
    Sink().take(next(batches))
    out.put((time.perf_counter() - start, "loader"))


def child(target: Any, *args: Any) -> Any:
    out = SPAWN.Queue()
    process = SPAWN.Process(target=target, args=(*args, out))
    process.start()
    try:
        return out.get(timeout=300)
    finally:
        process.join(30)


def stepping(cfg: Config, mode: str, root: str, steps: int, out: Any, go: Any, release: Any) -> None:
    """A rank process for the memory run: one rank with its DataLoader, or every rank's cache."""
    torch.set_num_threads(1)
    sink, step_s = Sink(), cfg.step_ms / 1000
    out.put("ready")
    go.wait()
    if mode == "loader":
        for batch in loader(cfg, 0, steps):
            sink.take(batch)
            time.sleep(step_s)
    else:
        caches = [bound(cfg, Path(root), rank)[0] for rank in range(cfg.ranks)]
        for step in range(steps):
            for cache in caches:
                sink.take(cache.batch(step))
            time.sleep(step_s)
    out.put("stepped")
    release.wait(120)  # the cache: its ranks' wants stay fresh while the window fills


# --- memory ----------------------------------------------------------------------------------------


def rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in bytes; empty when the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return {}
    fields = (line.split() for line in lines)
    return {f[0].rstrip(":"): int(f[1]) * 1024 for f in fields if len(f) == 3 and f[2] == "kB"}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def anon(pids: list[int]) -> int:
    """Anonymous memory of ``pids`` (PSS: a page shared after a fork counts once in all)."""
    return sum(rollup(p).get("Pss_Anon", 0) for p in pids)


def shared(pids: list[int], roots: tuple[Path, ...] = ()) -> int:
    """Bytes of the shared-memory objects (/dev/shm) that ``pids`` hold open or map, and of the
    files under ``roots``: each object once, by its blocks, whoever holds it."""
    held: dict[tuple[int, int], int] = {}

    def add(path: str | Path, follow: bool = True) -> None:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode):
            held[(st.st_dev, st.st_ino)] = st.st_blocks * 512

    for root in roots:
        for path in root.rglob("*"):
            add(path, follow=False)
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    add(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                add(f"/proc/{pid}/map_files/{fields[0]}")
    return sum(held.values())


def memory_loader(cfg: Config, steps: int) -> int:
    """Peak growth of one rank process with its DataLoader and its workers."""
    out, go, release = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
    rank = SPAWN.Process(target=stepping, args=(cfg, "loader", "", steps, out, go, release))
    rank.start()
    out.get(timeout=300)

    def now() -> int:
        pids = tree(rank.pid)
        return anon(pids) + shared(pids)

    base = now()
    go.set()
    peak = 0
    while True:
        peak = max(peak, now() - base)
        try:
            out.get(timeout=0.05)
            break
        except queue.Empty:
            pass
    release.set()
    rank.join(30)
    return peak


def memory_cache(cfg: Config, root: Path, steps: int) -> tuple[int, int, int, int, int]:
    """At the peak of their sum: the cache's shared memory (its files), the producer process's
    anonymous memory, its workers' own (the pages they no longer share with it), the ranks'
    growth; and the entries held once the window was full."""
    out, go, release = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
    store = BatchStore(root, JOB)
    with Producer(cfg, root, cfg.producer_workers) as prod:
        ranks = SPAWN.Process(target=stepping, args=(cfg, "cache", str(root), steps, out, go, release))
        ranks.start()
        out.get(timeout=300)
        base = anon(tree(ranks.pid))
        go.set()
        best = (0, 0, 0, 0)

        def sample() -> None:
            nonlocal best
            mine, theirs = tree(prod.process.pid), tree(ranks.pid)
            whole = rollup(mine[0]).get("Anonymous", 0)  # the producer's, shared with its workers or not
            now = (shared(mine + theirs, (root,)), whole, anon(mine) - whole, anon(theirs) - base)
            if sum(now) > sum(best):
                best = now

        stepped = False
        while not stepped:
            sample()
            try:
                stepped = out.get(timeout=0.05) == "stepped"
            except queue.Empty:
                pass
        full = cfg.ranks * (cfg.prefetch + cfg.lookback)
        deadline = time.monotonic() + 30
        while len(store.entries()) < full and time.monotonic() < deadline:
            sample()
            time.sleep(0.05)
        entries = len(store.entries())
        for _ in range(5):
            sample()
            time.sleep(0.05)
        release.set()
        ranks.join(30)
    return (*best, entries)


# --- step time -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Steps:
    """One run of the step loop: its timed steps' mean time, the rank's CPU per step, how long
    each step waited for its batch, the producer's CPU share (the cache's), the first batch."""

    step_s: float
    cpu_s: float
    gets: list[float]
    busy: float
    first: Any


def step_loop(cfg: Config, warmup: int, steps: int, get: Any) -> Steps:
    sink, step_s, gets, first = Sink(), cfg.step_ms / 1000, [], None
    for step in range(warmup + steps):
        if step == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        start = time.perf_counter()
        batch = get(step)
        if step >= warmup:
            gets.append(time.perf_counter() - start)
        if first is None:  # a list of micro-batches (the cache's) or one batch (the loader's)
            first = [
                {k: v.clone() for k, v in m.items()} for m in (batch if isinstance(batch, list) else [batch])
            ]
        sink.take(batch)
        time.sleep(step_s)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Steps(wall / steps, cpu / steps, gets, 0.0, first)


def steps_loader(cfg: Config, warmup: int, steps: int) -> Steps:
    batches = iter(loader(cfg, 0, warmup + steps))  # its workers end with it, on return
    return step_loop(cfg, warmup, steps, lambda step: next(batches))


def steps_cache(cfg: Config, root: Path, warmup: int, steps: int) -> Steps:
    with Producer(cfg, root, cfg.workers) as prod:
        cache, _ = bound(cfg, root, 0)
        cpu = [0.0, 0.0]

        def get(step: int) -> Any:
            if step == warmup:
                cpu[0] = cpu_seconds(prod.process.pid)
            return cache.batch(step)

        run = step_loop(cfg, warmup, steps, get)
        cpu[1] = cpu_seconds(prod.process.pid)
    run.busy = (cpu[1] - cpu[0]) / (run.step_s * steps)
    return run


def same(loaded: list[dict[str, torch.Tensor]], cached: list[dict[str, torch.Tensor]]) -> bool:
    (one,) = loaded
    return all(torch.equal(one[k], torch.cat([m[k] for m in cached])) for k in one)


# --- the run ---------------------------------------------------------------------------------------


def spread(values: list[float], scale: float, fmt: str) -> str:
    return (
        f"{statistics.median(values) * scale:{fmt}} [{min(values) * scale:{fmt}}-{max(values) * scale:{fmt}}]"
    )


def progress(name: str, run: Steps) -> str:
    waits = f"median {statistics.median(run.gets) * 1000:.2f}, max {max(run.gets) * 1000:.1f}"
    return f"{name} {run.step_s * 1000:.2f} ms (waits for the batch: {waits} ms)"


def row(name: str, cache: str = "", loader: str = "", ratio: str = "", target: str = "") -> None:
    print(f"{name:42s} {cache:>22s} {loader:>22s} {ratio:>8s}  {target}".rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of measures 1 and 3 (median)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps of measure 3")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--mem-steps", type=int, default=40, help="steps of measure 2")
    parser.add_argument("--step-ms", type=float, default=50.0, help="simulated accelerator time per step")
    parser.add_argument("--sample-ms", type=float, default=5.0, help="wait per sample in __getitem__")
    parser.add_argument("--image", type=int, default=224, help="image side (3 x image x image uint8)")
    parser.add_argument("--samples", type=int, default=50_000, help="dataset length")
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--micro", type=int, default=8, help="micro-batch (a cached batch is a list of them)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks on the node")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank; producer's")
    parser.add_argument(
        "--producer-workers", type=int, default=0, help="measure 2's producer (0: ranks x workers)"
    )
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--lookback", type=int, default=2)
    args = parser.parse_args()
    cfg = Config(
        args.samples, args.image, args.sample_ms, args.batch, args.micro, args.ranks, args.workers,
        args.producer_workers or args.ranks * args.workers, args.prefetch, args.lookback, args.step_ms,
    )  # fmt: skip
    torch.set_num_threads(1)
    batch_mib = args.batch * (3 * args.image**2 + 8) / MiB
    print(
        f"rank batch: {args.batch} samples (micro-batches of {args.micro}) of "
        f"3x{args.image}x{args.image} uint8, "
        f"{batch_mib:.2f} MiB, {args.sample_ms:g} ms per sample; {args.ranks} ranks per node, "
        f"{args.workers} workers per rank; cache prefetch {args.prefetch}, lookback {args.lookback}",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="sres-bench-data-", dir="/dev/shm"))
    try:
        # 1. first batch after a restart
        restart: dict[str, list[float]] = {"cache": [], "loader": []}
        wrong = []
        for trial in range(args.repeat):
            step = args.warmup + trial
            restart["loader"].append(child(restarted_loader, cfg, step)[0])
            root = tmp / f"restart-{trial}"
            with Producer(cfg, root, cfg.workers):
                cache, _ = bound(cfg, root, 0)  # the rank before its restart
                for s in range(step):
                    cache.batch(s)
                    time.sleep(cfg.step_ms / 1000)
                store, ahead = BatchStore(root, JOB), sampler(cfg)
                keys = [(s, key_of(ahead.indices(s, 0, cfg.ranks))) for s in range(step, step + cfg.prefetch)]
                deadline = time.monotonic() + 30
                while not all(store.has(*k) for k in keys) and time.monotonic() < deadline:
                    time.sleep(0.01)
                seconds, where = child(restarted_cache, cfg, str(root), step)
                restart["cache"].append(seconds)
                if where != "cache":
                    wrong.append(where)
            print(
                f"  restart {trial + 1}: cache {restart['cache'][-1] * 1000:7.1f} ms, "
                f"loader {restart['loader'][-1] * 1000:7.1f} ms",
                flush=True,
            )

        # 2. memory per node
        loader_one = memory_loader(cfg, args.mem_steps)
        print(f"  memory: loader rank {loader_one / MiB:.1f} MiB", flush=True)
        files, prod, prod_workers, ranks_growth, entries = memory_cache(cfg, tmp / "memory", args.mem_steps)
        print(
            f"  memory: cache files {files / MiB:.1f} MiB ({entries} entries), "
            f"producer {prod / MiB:.1f} + {prod_workers / MiB:.1f} MiB, "
            f"ranks {ranks_growth / MiB:.1f} MiB",
            flush=True,
        )

        # 3. steady-state step time, interleaved
        runs: dict[str, list[Steps]] = {"loader": [], "cache": []}
        for trial in range(args.repeat):
            runs["loader"].append(steps_loader(cfg, args.warmup, args.steps))
            runs["cache"].append(steps_cache(cfg, tmp / f"steps-{trial}", args.warmup, args.steps))
            print(
                f"  steps {trial + 1}: " + ", ".join(progress(k, r[-1]) for k, r in runs.items()), flush=True
            )
        identical = all(same(a.first, b.first) for a, b in zip(runs["loader"], runs["cache"]))
        step_t = {k: [r.step_s for r in v] for k, v in runs.items()}
        cpu_t = {k: [r.cpu_s for r in v] for k, v in runs.items()}
        busy = [r.busy for r in runs["cache"]]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in restart.items()}
    loaders = loader_one * args.ranks
    cache_total = files + prod + prod_workers + ranks_growth
    steps_med = {k: statistics.median(v) for k, v in step_t.items()}
    cpu_med = {k: statistics.median(v) * 1000 for k, v in cpu_t.items()}
    print()
    row("measure", "cache", "DataLoader", "ratio", "target")
    row(
        "1. first batch after a restart, ms",
        spread(restart["cache"], 1000, ".1f"),
        spread(restart["loader"], 1000, ".1f"),
        f"{med['loader'] / med['cache']:.1f}x",
        ">= 20x faster",
    )
    row(
        f"2. memory per node, {args.ranks} ranks, MiB",
        f"{cache_total / MiB:.1f}",
        f"{loaders / MiB:.1f}",
        f"{cache_total / loaders:.2f}",
        "<= 0.33",
    )
    row("     cache files (one copy per node)", f"{files / MiB:.1f}", "", f"{files / loaders:.2f}")
    row("     producer process", f"{prod / MiB:.1f}")
    row(f"     producer's {cfg.producer_workers} workers (their own pages)", f"{prod_workers / MiB:.1f}")
    row("     ranks (growth, with their workers)", f"{ranks_growth / MiB:.1f}", f"{loaders / MiB:.1f}")
    row(
        f"3. step time ({args.step_ms:g} ms accelerator), ms",
        spread(step_t["cache"], 1000, ".2f"),
        spread(step_t["loader"], 1000, ".2f"),
        f"{(steps_med['cache'] / steps_med['loader'] - 1) * 100:+.2f}%",
        "<= +1%",
    )
    row("     rank CPU per step (get + copy), ms", f"{cpu_med['cache']:.2f}", f"{cpu_med['loader']:.2f}")
    row("     producer loop CPU, % of a core", f"{statistics.median(busy) * 100:.1f}")
    print(
        f"\ncached batches identical to the DataLoader's: {'yes' if identical else 'NO'}; restarted ranks' "
        f"first batch from the cache: {'all' if not wrong else 'not all (' + ', '.join(wrong) + ')'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
