"""How a real gloo re-formation grows with the number of ranks on this machine, and where its time goes.

Every fault ends a generation, and every rank of the next one (survivors and replacement) then
passes our join barrier, forms the generation's two gloo groups on the supervisor's store and
runs a first collective. This runs N real rank processes doing exactly that with the project's
own code (``PlanChannel.wait_for``/``join``, ``formation.form``, ``formation.destroy``, a signed
``RunStore`` client, a ``GenerationWatch``); the store is hosted by this process, as the
supervisor hosts it, never by a rank. This process publishes plan G, waits for every rank's
timings (a multiprocessing queue between it and its own children), then publishes plan G+1.

Each rank times, per generation (parent and ranks read the same system-wide monotonic clock):
  see        plan G published -> seen by ``PlanChannel.wait_for`` (no liveness link here: a store poll)
  join       ``PlanChannel.join``: our barrier, until every member has joined
  init_pg    ``init_process_group`` on the generation's prefixed store (inside ``formation.form``)
  state_pg   ``new_group``: the gloo state group (inside ``formation.form``)
  form       ``formation.form`` as a whole: both groups and the GenerationWatch's bookkeeping
  allreduce  the first collective: an allreduce of 16 floats on the default group
  teardown   what the rank loop does on leaving: shut the generation's sockets, ``formation.destroy``
  total      join + form + allreduce + teardown, on one rank
  wall       plan G published -> the last rank's teardown done
Per N: the median over generations of the slowest rank's seconds, each part on its own (the
slowest rank of one part need not be the slowest of another, so parts do not add up to the
total), and the growth from the smallest N to the largest: the ratio, and seconds per added
rank (a least-squares line through every N). Generation 1, the first formation (torch's
first-use costs), is a warm-up and not counted.

    python benchmarks/reformation_scale.py [--ranks 4,8,16,32] [--generations 4] [--json]
    python benchmarks/reformation_scale.py --code /tmp/oldtree   # another checkout's resilience

``--code`` takes a checkout with ``formation.form``/``destroy`` and ``run_secret.store_key`` (ccaaee1 on).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import queue as queue_errors
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from resilience.agent.heartbeat import GenerationWatch
    from resilience.contract.messages import Plan
    from resilience.contract.rank_env import RankEnv
    from resilience.contract.run_store import RunStore

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("see", "join", "init_pg", "state_pg", "form", "allreduce", "teardown", "total", "wall")
SPANS = {
    "join": ("seen", "joined"),
    "form": ("joined", "formed"),
    "allreduce": ("formed", "reduced"),
    "teardown": ("reduced", "left"),
    "total": ("seen", "left"),
}
"""Parts that one rank's timestamps bound: part -> (start stamp, end stamp)."""
INSIDE_FORM = {"init_pg": "init_process_group", "state_pg": "new_group"}
"""Parts of ``formation.form`` timed around torch's own functions: part -> torch.distributed name."""
WARMUP = 1
READY_TIMEOUT_S = 900.0
"""Starting 32 interpreters that import torch on 2 cores takes a while."""


@dataclass(frozen=True)
class Job:
    """What a rank process is given: what the supervisor puts in a rank's ``RankEnv``."""

    world: int
    port: int
    nonce: str
    timeout_s: float
    secret: str = field(repr=False)


def rank_process(job: Job, rank: int, queue: Queue[dict[str, Any]]) -> None:
    """One rank process. Its error goes to the parent as text: the parent must not wait for a
    report that a dead rank will never send."""
    try:
        _rank_loop(job, rank, queue)
    except BaseException:
        queue.put({"rank": rank, "error": traceback.format_exc()})
        raise


def _rank_loop(job: Job, rank: int, queue: Queue[dict[str, Any]]) -> None:
    """Connect as a rank does (``RankLoop.__init__``), then take every generation planned for
    this slot until the parent shuts the run down. resilience is imported here, not at module
    level: see :func:`main`."""
    torch.set_num_threads(1)
    from resilience.agent.heartbeat import GenerationWatch
    from resilience.contract import run_secret
    from resilience.contract.rank_env import RankEnv
    from resilience.contract.run_store import RunStore
    from resilience.contract.slots import rank_slot

    env = RankEnv(
        store_host="127.0.0.1",
        store_port=job.port,
        slot=rank_slot(rank, 0),
        store_nonce=job.nonce,
        node=rank,
        reform_timeout_s=job.timeout_s,
        run_secret=job.secret,
    )
    store = RunStore.connect(
        env.store_host, env.store_port, run_secret.store_key(env.run_secret, env.store_nonce)
    )
    watch = GenerationWatch()
    queue.put({"rank": rank, "ready": 1.0})
    generation = 0
    while (plan := store.plans.wait_for(env.slot, generation)) is not None:
        generation = plan.generation
        queue.put({"rank": rank, **_one_generation(plan, env, store, watch)})


def _one_generation(plan: Plan, env: RankEnv, store: RunStore, watch: GenerationWatch) -> dict[str, float]:
    """Join, form, reduce once and leave, as the rank loop does; the monotonic time at each
    boundary, and the seconds spent in each of torch's two group inits."""
    from resilience.agent import formation

    stamps = {"seen": time.monotonic()}
    if not store.plans.join(plan, env.reform_timeout_s):
        raise RuntimeError(f"generation {plan.generation} was superseded: only this benchmark plans")
    stamps["joined"] = time.monotonic()
    rank = plan.rank_of(env.slot)
    assert rank is not None, "every plan of this benchmark holds every slot"
    with _time_calls(INSIDE_FORM) as inside:
        formation.form(plan, rank, env, store, watch)
    stamps["formed"] = time.monotonic()
    total = torch.ones(16)
    dist.all_reduce(total)
    stamps["reduced"] = time.monotonic()
    if total[0].item() != plan.world_size:
        raise RuntimeError(f"allreduce gave {total[0].item()}, not {plan.world_size}")
    # RankLoop._teardown without the state a training rank has (commits, tiers, user objects):
    watch.release_now(watch.generation)  # our side of every connection is shut first
    watch.leave()
    formation.destroy()
    watch.left()
    stamps["left"] = time.monotonic()
    return {**stamps, **inside}


@contextmanager
def _time_calls(parts: dict[str, str]) -> Iterator[dict[str, float]]:
    """Seconds spent in torch.distributed's functions while the block runs, by part (NaN: not
    called). ``formation.form`` calls both inits in one function (``join_groups``): timing
    torch's entry points splits it without copying the project's code here."""
    spent = dict.fromkeys(parts, math.nan)
    originals = {part: getattr(dist, name) for part, name in parts.items()}

    def timed(part: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                spent[part] = time.monotonic() - start

        return wrapper

    for part, call in originals.items():
        setattr(dist, parts[part], timed(part, call))
    try:
        yield spent
    finally:
        for part, call in originals.items():
            setattr(dist, parts[part], call)


def _plan(generation: int, world: int) -> Plan:
    """Generation G with every rank on a node of its own, as the supervisor would write it."""
    from resilience.contract.messages import Plan, SlotInfo
    from resilience.contract.slots import rank_slot

    members: dict[int, str] = {rank: rank_slot(rank, 0) for rank in range(world)}
    slots: dict[str, SlotInfo] = {slot: SlotInfo(node=rank, local_rank=0) for rank, slot in members.items()}
    return Plan(generation=generation, world_size=world, members=members, slots=slots, procs_per_node=1)


def _collect(
    queue: Queue[dict[str, Any]], procs: Sequence[BaseProcess], count: int, timeout_s: float
) -> list[dict[str, float]]:
    """``count`` messages from the ranks; a rank's error or death ends the benchmark at once."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        try:
            message = queue.get(timeout=1.0)
        except queue_errors.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise SystemExit(f"{count - len(got)} rank(s) never reported (exit codes {dead})") from None
            continue
        if "error" in message:
            raise SystemExit(f"rank {message['rank']} failed:\n{message['error']}")
        got.append(message)
    return got


def _slowest(reports: list[dict[str, float]], published: float) -> dict[str, float]:
    """Each part's slowest rank in one generation."""
    parts = {"see": max(r["seen"] for r in reports) - published}
    for part, (start, end) in SPANS.items():
        parts[part] = max(r[end] - r[start] for r in reports)
    for part in INSIDE_FORM:
        parts[part] = max(r[part] for r in reports)
    parts["wall"] = max(r["left"] for r in reports) - published
    return parts


def measure(world: int, generations: int, timeout_s: float) -> list[dict[str, float]]:
    """``world`` rank processes through ``WARMUP + generations`` generations; the slowest rank's
    seconds per part, for each counted generation."""
    from resilience.contract import run_secret
    from resilience.contract.run_store import RunStore

    secret, nonce = run_secret.new_secret(), run_secret.new_challenge()
    store = RunStore.host(run_secret.store_key(secret, nonce))  # as the supervisor's _run_store
    job = Job(world, store.port, nonce, timeout_s, secret)
    spawn = mp.get_context("spawn")
    queue: Queue[dict[str, Any]] = spawn.Queue()
    procs = [spawn.Process(target=rank_process, args=(job, r, queue), daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    rows = []
    try:
        _collect(queue, procs, world, READY_TIMEOUT_S)
        for generation in range(1, WARMUP + generations + 1):
            published = time.monotonic()
            store.plans.publish(_plan(generation, world))
            rows.append(_slowest(_collect(queue, procs, world, 2 * timeout_s), published))
            counted = "" if generation > WARMUP else " (warm-up)"
            print(f"  N={world} generation {generation}{counted}: {_parts(rows[-1])}", flush=True)
    finally:
        store.plans.shut_down()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return rows[WARMUP:]


def _parts(row: dict[str, float]) -> str:
    """One generation's figures on one progress line: a stalled or noisy N shows as it runs."""
    return " ".join(f"{part} {row[part]:.3f}" for part in PARTS)


def growth(medians: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per part: largest N over smallest N, and seconds per added rank (least squares over every N)."""
    ns = sorted(medians)
    out = {}
    for part in PARTS:
        first, last = medians[ns[0]][part], medians[ns[-1]][part]
        slope = statistics.linear_regression(ns, [medians[n][part] for n in ns]).slope
        out[part] = {"ratio": last / first if first > 0 else math.nan, "per_rank_s": slope}
    return out


def print_table(medians: dict[int, dict[str, float]], generations: int, code: Path) -> None:
    """The medians per N, then the growth rows: where the time goes, and which part grows."""
    ns = sorted(medians)
    print(
        f"\nre-formation, gloo on {os.cpu_count()} cores, resilience from {code}: seconds, "
        f"median of {generations} generations of the slowest rank (each part on its own)"
    )
    print(f"{'N':>8} " + " ".join(f"{p:>9}" for p in PARTS))
    for n in ns:
        print(f"{n:>8} " + " ".join(f"{medians[n][p]:>9.4f}" for p in PARTS))
    if len(ns) > 1:
        rise = growth(medians)
        print(f"{f'{ns[-1]}/{ns[0]}':>8} " + " ".join(f"{rise[p]['ratio']:>8.1f}x" for p in PARTS))
        print(f"{'s/rank':>8} " + " ".join(f"{rise[p]['per_rank_s']:>9.4f}" for p in PARTS))


def _finite(value: float) -> float | None:
    """JSON has no NaN: a part never timed (torch's function not called) is null."""
    return round(value, 5) if math.isfinite(value) else None


def as_json(medians: dict[int, dict[str, float]], args: argparse.Namespace, wall_s: float) -> str:
    """One line for scripts: every figure of the table (null where torch's function was never called)."""
    rise = growth(medians) if len(medians) > 1 else {}
    return json.dumps(
        {
            "code": str(args.code),
            "generations": args.generations,
            "warmup": WARMUP,
            "cores": os.cpu_count(),
            "ranks": {str(n): {p: _finite(v) for p, v in parts.items()} for n, parts in medians.items()},
            "growth": {p: {k: _finite(v) for k, v in g.items()} for p, g in rise.items()},
            "wall_s": round(wall_s, 1),
        }
    )


def main() -> int:
    """Parse, point imports at ``--code``, measure each N in turn. Nothing of resilience is
    imported at module level: the parent may import it only after ``--code`` is on sys.path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="4,8,16,32", help="world sizes, comma-separated")
    parser.add_argument("--generations", type=int, default=4, help="counted generations per N")
    parser.add_argument("--timeout", type=float, default=120.0, help="the ranks' reform_timeout_s")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose resilience runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    args.code = args.code.resolve()
    # The parent imports resilience from here; spawned ranks get this sys.path, and PYTHONPATH
    # carries it to anything they start.
    sys.path.insert(0, str(args.code))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.code), os.environ.get("PYTHONPATH")]))
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    start = time.monotonic()
    medians = {}
    for world in sorted(int(n) for n in args.ranks.split(",")):
        rows = measure(world, args.generations, args.timeout)
        medians[world] = {p: statistics.median(row[p] for row in rows) for p in PARTS}
    print_table(medians, args.generations, args.code)
    wall_s = time.monotonic() - start
    print(f"\n{wall_s:.0f} s in all (process start-up included)")
    if args.json:
        print(as_json(medians, args, wall_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
