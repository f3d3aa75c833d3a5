"""A node's batch producer: makes the entries its ranks will read, ahead of them.

Not a rank: a process of its own per node (slot ``n<node>b``), started by the supervisor when a
rank of the node asks for it and started again when it dies, so it outlives every rank restart
and recovery. It runs the user's script like a rank does, but ``resilience.run(train,
batches=make_source)`` calls ``make_source()`` in it and serves, never ``train``. Its state is
the cache itself: a new producer reads the ranks' wants and the entries present and goes on
where the last one stopped. Batches are made in ``source.workers`` forked processes (each
writes its entry; nothing but a size comes back), the nearest step first.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from resilience import parent_death
from resilience.contract.rank_env import RankEnv
from resilience.data import wants
from resilience.data.batch_source import BatchSource
from resilience.data.batch_store import BatchStore, batches_dir

log = logging.getLogger("resilience")

IDLE_S = 0.01
"""A wait with nothing to make: the ranks ask ``prefetch`` steps ahead, so nothing is late for it."""
_WORK: tuple[BatchSource, BatchStore] | None = None
"""The source and the cache, set before the workers fork: they inherit them (never pickled)."""


def node_cache(env: RankEnv) -> tuple[Path, str]:
    """The cache directory of this process's node, and the job it belongs to: the same for the
    node's ranks and producer, another for any other job or node."""
    from resilience.tiers.layout import default_job_id, ram_root

    job = env.tiers.job_id if env.tiers is not None else default_job_id(os.environ, Path(env.log_dir))
    return batches_dir(job, env.node_name or env.node, ram_root()), job


def serve(source: BatchSource, root: Path, job: str, stop: Callable[[], bool] = lambda: False) -> None:
    """Make what the node's ranks want until ``stop()`` (a test's) or the process is killed."""
    global _WORK
    store = BatchStore(root, job)
    _WORK = (source, store)
    pool = (
        ProcessPoolExecutor(
            source.workers, mp_context=multiprocessing.get_context("fork"), initializer=_die_with_parent
        )
        if source.workers > 0
        else None
    )
    running: dict[tuple[int, str], Future[int]] = {}
    try:
        while not stop():
            for entry in [e for e, f in running.items() if f.done()]:
                running.pop(entry).result()  # a source's error ends the producer: the supervisor says so
            ranks = wants.read(root)
            if ranks:
                store.keep(min(r.step - r.lookback for r in ranks), 1 << 62)
            todo = sorted({(w.step, w.key): w for r in ranks for w in r.wants}.values(), key=lambda w: w.step)
            todo = [w for w in todo if (w.step, w.key) not in running and not store.has(w.step, w.key)]
            if pool is None and todo:
                _make(todo[0].step, todo[0].args)
                continue
            for w in todo[: max(0, (source.workers if pool else 1) - len(running))]:
                assert pool is not None
                running[(w.step, w.key)] = pool.submit(_make, w.step, w.args)
            if not todo or pool is not None:
                time.sleep(IDLE_S)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # without waiting, a worker never hears it


def _die_with_parent() -> None:
    """A worker goes with its producer, however that ends (a kill of the producer alone, an
    out-of-memory kill), instead of waiting forever beside the next one."""
    parent_death.ask(signal.SIGKILL)
    if os.getppid() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _make(step: int, args: Any) -> int:
    assert _WORK is not None
    source, store = _WORK
    return store.put(step, source.make(step, args), args)


def main(env: RankEnv, make_source: Callable[[], BatchSource] | None) -> None:
    """The producer process's life (``resilience.run`` in slot ``n<node>b``)."""
    if make_source is None:
        raise SystemExit(
            "sres: a batch producer was started, but resilience.run(train) was not given batches="
        )
    root, job = node_cache(env)
    log.info("batch producer of node %s serving %s", env.node_name or env.node, root)
    serve(make_source(), root, job)
