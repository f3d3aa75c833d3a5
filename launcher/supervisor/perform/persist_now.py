"""Persist the newest committed state now (preemption, requeue), while training goes on; then
the ranks' own hooks before the requeue (``ctx.on_requeue``).

Two rounds through store keys that every rank watches on a thread of its own (no commit
needed): each rank reports the newest step in its RAM tier and from then on keeps every
commit there; then every rank copies the newest step reported (ranks are at most a commit
apart: a rank one behind copies it once it commits it) to the persistent directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from launcher.observability.events import EventLog
from launcher.supervisor.perform.hands import Clocks
from resilience.contract.messages import FlushDone
from resilience.contract.run_store import RunStore
from resilience.tiers.registry import PERSISTENT


def flush_persistent(
    store: RunStore,
    ranks: Iterable[int],
    events: EventLog,
    timeout_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    generation: int = 0,
) -> int | None:
    """The step persisted on every rank, or None (nothing committed, a failure, the timeout;
    a ``flush-failed`` event says why). Callable from any thread with its own store clone."""
    ranks = list(ranks)
    deadline = clock() + timeout_s
    answers = _round(store, ranks, None, deadline, clock, sleep, generation)
    target = max((a.step for a in answers or () if a.step is not None), default=None)
    if answers and target is not None and all(a.step is not None for a in answers):
        answers = _round(store, ranks, target, deadline, clock, sleep, generation)
        if answers and all(a.step == target for a in answers):
            events.emit("flushed", step=target, tier=PERSISTENT.name)
            return target
    errors = sorted({a.error for a in answers or () if a.error}) or ["timeout"]
    events.emit("flush-failed", errors=errors)
    return None


def _round(
    store: RunStore,
    ranks: list[int],
    step: int | None,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    generation: int,
) -> list[FlushDone] | None:
    """One request to ``generation``'s ranks, and their answers (None: not all by the deadline)."""
    request = store.tiers.request_flush(step, max(1.0, deadline - clock()), generation)
    while (answers := store.tiers.flush_answers(request, ranks)) is None:
        if clock() > deadline:
            return None
        sleep(0.05)
    return answers


def run_requeue_hooks(
    store: RunStore, slots: Iterable[str], cause: str, timeout_s: float, clocks: Clocks
) -> str:
    """Announce the requeue and wait for every rank that registered a hook (``ctx.on_requeue``) to
    run them; what went wrong, in words ("" when every hook ran). Ranks without hooks are not
    waited for; a hook that does not answer within ``timeout_s`` is left behind."""
    hooked = store.requeue.hooked(slots)
    if not hooked:
        return ""
    notice = store.requeue.announce(cause, timeout_s)
    deadline = clocks.clock() + timeout_s
    while len(answers := store.requeue.answers(notice, hooked)) < len(hooked) and clocks.clock() < deadline:
        clocks.sleep(0.05)
    late = sorted(set(hooked) - set(answers))
    errors = sorted({f"{slot}: {error}" for slot, error in answers.items() if error})
    if late:
        errors.append(f"no answer within {timeout_s:g} s from {', '.join(late)}")
    return "; ".join(errors)
