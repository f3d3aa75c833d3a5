"""When the job cannot go on where it is: requeue or fail, and what a requeue signal means. Pure.

Requeues are counted per cause: a job that cannot finish in its time limit should stop after
its time-limit requeues, while one preempted by the scheduler was not at fault.
"""

from __future__ import annotations

from launcher.supervisor.policy.actions import Action, Fail, Requeue
from launcher.supervisor.config import RunConfig


def requeue_or_fail(
    why: str, config: RunConfig, save: bool = False, cause: str = "fault", wait_s: float = 0.0
) -> Action:
    """The job cannot go on here: requeue it (it resumes from its saved state) unless it
    already used its requeues. Time-limit requeues have a cap of their own when one is set
    (``--max-timeout-requeues``, submitit's ``max_num_timeout``): a job that cannot finish in
    its time limit should stop, while one preempted by the scheduler was not at fault."""
    used, cap, flag = requeues_counted(config, cause)
    if cap is not None and used >= cap:
        if flag == "--max-timeout-requeues":  # "timed-out too many times": submitit's words, looked for
            return Fail(
                f"{why}; timed-out too many times: the job was already requeued {used} time(s) at its "
                f"time limit ({flag} {cap})"
            )
        return Fail(f"{why}; the job was already requeued {used} time(s) ({flag} {cap})")
    return Requeue(why, save, cause, wait_s)


def requeues_counted(config: RunConfig, cause: str) -> tuple[int, int | None, str]:
    """(requeues used so far, their cap or None, the option that sets it) for a requeue of ``cause``."""
    if config.max_timeout_requeues is None:
        return config.restart_count, config.max_requeues, "--max-requeues"
    if cause == "time-limit":
        return config.timeout_requeues, config.max_timeout_requeues, "--max-timeout-requeues"
    return config.restart_count - config.timeout_requeues, config.max_requeues, "--max-requeues"


TIME_LIMIT_WINDOW = (600.0, 0.2)
"""A requeue signal counts as the time limit's when it comes in the job's last 10 minutes or
last 20% of its limit, whichever is longer: submitit's rule, so ``max_num_timeout`` counts
what it counts under submitit. Without a known limit it is a preemption."""


def signal_cause(time_left_s: float | None, time_limit_s: float | None) -> str:
    """``time-limit`` or ``preemption``: what a requeue signal (``--preempt-signal``) means."""
    if time_left_s is None or time_limit_s is None:
        return "preemption"
    seconds, share = TIME_LIMIT_WINDOW
    return "time-limit" if time_left_s <= max(seconds, share * time_limit_s) else "preemption"
