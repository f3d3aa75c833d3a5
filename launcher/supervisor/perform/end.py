"""Performing the end of a run: requeue, finish, fail; and what a finished run leaves behind.

Each function performs one action (:mod:`launcher.supervisor.policy.actions`) with the run's
:class:`~launcher.supervisor.perform.hands.Hands` and returns the run's
:class:`~launcher.supervisor.perform.books.Outcome`.
"""

from __future__ import annotations

import os

from launcher.errors import SlurmError, SresError
from launcher.observability.events import summary
from launcher.supervisor.policy import actions as act
from launcher.supervisor.perform.books import Outcome
from launcher.supervisor.perform.persist_now import run_requeue_hooks
from launcher.supervisor.perform.hands import Hands
from launcher.supervisor.policy.classify import error_at, own_errors
from launcher.supervisor.policy.requeue import requeues_counted
from resilience import tiers
from resilience.contract.messages import Report

HOOKS_MIN_S = 5.0
"""The ranks' requeue hooks get at least this long, whatever persisting the commit took."""
REQUEUE_RETRY_S = 5.0
"""Between two requeue requests Slurm did not answer (each already waits out scontrol's retries)."""
LATE_ERRORS_S = 2.0
"""How long a failing run waits for its ranks still running to report: ranks that raise alike
(submitit's tasks) report moments apart, and the failed event must name the lowest of them, not
the first to reach the store. Ranks stuck in a collective cost this much, once."""
FAILED_ERRORS = 16
"""The ranks' own errors a ``failed`` event keeps (lowest ranks): a thousand ranks failing alike
would make one event of a thousand tracebacks."""


def requeue(h: Hands, a: act.Requeue) -> Outcome:
    """``save``: every rank is alive (preemption), so the newest committed step is persisted
    first; after a node loss the generation is broken and the last periodic save serves."""
    c = h.config
    t0 = h.clocks.clock()
    saved = h.flush(c.preempt_save_timeout_s) if a.save else None
    if a.save and saved is None:
        h.say(
            "warning: nothing was persisted before the requeue (no --persistent-dir, or the save failed): "
            "the restart resumes from the newest state the tiers still hold"
        )
    if a.save:  # every rank is alive: theirs to say what else must outlive the job
        members = h.books.current_plan.members.values()
        left = max(HOOKS_MIN_S, c.preempt_save_timeout_s - (h.clocks.clock() - t0))  # one budget for both
        problem = run_requeue_hooks(h.store, members, a.cause, left, h.clocks)
        if problem:
            h.say(f"warning: the ranks' requeue hooks did not all run: {problem}")
    h.events.emit("requeue", why=a.why, cause=a.cause, restart_count=c.restart_count, saved_step=saved)
    used, cap, flag = requeues_counted(c, a.cause)
    h.say(
        f"{a.why}: requeueing the job (restart {c.restart_count + 1}"
        + (f"; {used + 1} of at most {cap} under {flag})" if cap is not None else ")")
    )
    h.store.plans.shut_down()
    for slot in h.books.slots:  # what they held is saved: a rank still starting up must not delay the end
        h.processes.kill(slot)
    try:
        _ask_until(h, a)
    except SresError as err:
        return fail(h, act.Fail(f"{a.why}; and the job cannot be requeued: {err}"))
    return Outcome(False, f"requeued: {a.why}", h.events.events, requeued=True)


def _ask_until(h: Hands, a: act.Requeue) -> None:
    """``scontrol requeue``, asked again while Slurm does not answer, for up to ``a.wait_s``
    (an isolated supervisor: nothing but its link coming back lets the job go on)."""
    deadline = h.clocks.clock() + a.wait_s
    said = False
    while True:
        try:
            h.job.requeue(a.why)
            return
        except SlurmError as err:
            if h.clocks.clock() + REQUEUE_RETRY_S > deadline:
                raise
            if not said:
                every = f"every {REQUEUE_RETRY_S:g} s for up to {a.wait_s:g} s"
                h.say(f"cannot requeue yet ({err}); asking again {every}")
                said = True
            h.clocks.sleep(REQUEUE_RETRY_S)


def finish(h: Hands, a: act.Finish) -> Outcome:
    b = h.books
    generation = b.current_plan.generation
    h.recovery.check(generation)
    fields = h.recovery.finished(h.clocks.wall())
    h.copy_events()  # every rank said all it had to before its "done"
    h.events.emit(
        "finished",
        faults=b.faults,
        generations=generation,
        **fields,
        state_digests={str(rank): digest for rank, digest in a.digests},
    )
    h.say(summary(h.events.events))
    b.finished = True
    return Outcome(True, events=h.events.events)


def fail(h: Hands, a: act.Fail) -> Outcome:
    b = h.books
    culprit = a.culprit or b.first_culprit
    blame = (
        {}
        if culprit is None
        else {"rank": culprit.rank, "error_type": culprit.error_type, "traceback": culprit.traceback}
    )
    errors = _with_late_errors(h, a.errors)
    own = {str(r.rank): r.traceback for r in errors[:FAILED_ERRORS] if r.traceback}
    h.copy_events()
    h.events.emit("failed", reason=a.reason, faults=b.faults, **blame, **({"errors": own} if own else {}))
    if culprit is not None and culprit.traceback:
        # a.culprit: an error that recurred, the run's first one again unless another came before
        first = a.culprit is None or error_at(a.culprit) == error_at(b.first_culprit)
        h.out.write(f"{'first failure' if first else 'failure'} (rank {culprit.rank}):\n{culprit.traceback}")
    for slot in b.slots:
        h.processes.kill(slot)
    h.say(f"error: {a.reason}")
    return Outcome(False, a.reason, h.events.events)


def _with_late_errors(h: Hands, decided: tuple[Report, ...]) -> tuple[Report, ...]:
    """``decided`` and the own errors of ranks that reported after the fault was decided, waiting
    up to ``LATE_ERRORS_S`` for the members still running to report."""
    b = h.books
    if b.plan is None:
        return decided
    generation = b.current_plan.generation
    deadline = h.clocks.clock() + LATE_ERRORS_S
    while True:
        reports = {
            slot: h.store.liveness.report_of(generation, slot) for slot in b.current_plan.members.values()
        }
        running = [s for s, r in reports.items() if r is None and h.processes.poll(s) is None]
        if not running or h.clocks.clock() >= deadline:
            break
        h.clocks.sleep(0.05)
    known = {d.rank for d in decided}
    late = [r for r in reports.values() if r is not None and r.rank not in known]
    return own_errors([*decided, *late])


def after_stop(h: Hands) -> None:
    """Every process is gone: a finished run's RAM tier and batch caches go, as nothing will
    restart from them (removed any earlier, a standby or spare still starting up would write
    them again)."""
    if h.books.finished:
        c = h.config
        job = c.tiers.job_id if c.tiers is not None else tiers.default_job_id(os.environ, c.log_dir)
        tiers.remove_job(job, h.ram_root())
