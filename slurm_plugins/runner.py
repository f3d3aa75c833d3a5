"""Run checks with a hard time budget per check and in total.

Why a process per check: a hung NVML call or a stat() on a dead NFS mount cannot be
interrupted from inside Python, and a thread cannot be killed. Each check runs in a forked
child that leads its own process group, so that when its budget runs out the whole group
(the check and any program it started, e.g. ``nvidia-smi``) gets SIGKILL and the check is
reported ``timeout``. Checks run side by side: the prolog waits for the slowest one, not for
their sum. Results come back over a pipe as JSON.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_plugins.checks.base import Check, CheckContext, CheckResult, Status

Clock = Callable[[], float]


@dataclass
class _Running:
    check: Check
    pid: int
    fd: int
    started: float
    deadline: float
    data: bytes = b""
    done: bool = False


def run_checks(
    checks: Sequence[Check],
    ctx: CheckContext,
    per_check_s: float,
    total_s: float,
    clock: Clock = time.monotonic,
) -> list[CheckResult]:
    """Run every check; return their results in the order of ``checks``."""
    start = clock()
    end = start + total_s
    running = [_start(check, ctx, start, min(start + per_check_s, end)) for check in checks]
    try:
        _collect(running, clock)
    finally:
        for r in running:
            _reap(r)
    results: list[CheckResult] = []
    for r in running:
        results += _results(r, clock, per_check_s, end)
    return results


def run_in_turn(
    checks: Sequence[Check],
    ctx: CheckContext,
    per_check_s: float,
    total_s: float,
    clock: Clock = time.monotonic,
) -> list[CheckResult]:
    """One check at a time (stress tests must not compete for the machine), same budgets."""
    end = clock() + total_s
    results: list[CheckResult] = []
    for check in checks:
        left = end - clock()
        if left <= 0:
            results.append(
                CheckResult(
                    check.name, Status.TIMEOUT, f"not run: total budget of {total_s:g} s used up", check.fault
                )
            )
            continue
        results += run_checks([check], ctx, min(per_check_s, left), left, clock)
    return results


def _start(check: Check, ctx: CheckContext, now: float, deadline: float) -> _Running:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        status = 0
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            started = time.monotonic()
            try:
                found = list(check.run(ctx))
            except Exception as err:  # noqa: BLE001 - a broken check is a failed check
                last = traceback.extract_tb(err.__traceback__)[-1]
                where = f" at {os.path.basename(last.filename)}:{last.lineno}"
                found = [
                    CheckResult(
                        check.name,
                        Status.FAIL,
                        f"check crashed: {type(err).__name__}: {err}{where}",
                        check.fault,
                    )
                ]
            took = time.monotonic() - started
            payload = [{**r.to_json(), "duration_s": round(took, 3)} for r in found]
            with os.fdopen(write_fd, "wb") as out:
                out.write(json.dumps(payload).encode())
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)  # also from the parent: no race with an early kill
    except OSError:
        pass
    return _Running(check, pid, read_fd, now, deadline)


def _collect(running: list[_Running], clock: Clock) -> None:
    while True:
        waiting = [r for r in running if not r.done]
        if not waiting:
            return
        now = clock()
        for r in waiting:
            if now >= r.deadline:
                _kill(r)
        waiting = [r for r in waiting if not r.done]
        if not waiting:
            return
        timeout = max(0.0, min(r.deadline for r in waiting) - now)
        ready, _, _ = select.select([r.fd for r in waiting], [], [], timeout)
        for r in waiting:
            if r.fd in ready:
                chunk = os.read(r.fd, 65536)
                if chunk:
                    r.data += chunk
                else:
                    r.done = True


def _kill(r: _Running) -> None:
    try:
        os.killpg(r.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    r.done = True
    r.data = b""
    r.deadline = -1.0  # marks "killed at its budget"


def _reap(r: _Running) -> None:
    try:
        os.close(r.fd)
    except OSError:
        pass
    # A child stuck in the kernel (D state) cannot die yet; do not wait for it forever.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(r.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            return
        time.sleep(0.01)


def _results(r: _Running, clock: Clock, per_check_s: float, end: float) -> list[CheckResult]:
    if r.deadline < 0:
        budget = min(per_check_s, max(0.0, end - r.started))
        return [
            CheckResult(
                r.check.name, Status.TIMEOUT, f"killed after {budget:g} s budget", r.check.fault, budget
            )
        ]
    try:
        return [CheckResult.from_json(item) for item in json.loads(r.data.decode() or "null") or []]
    except (ValueError, KeyError, TypeError):
        return [
            CheckResult(
                r.check.name, Status.FAIL, "check ended without a result", r.check.fault, clock() - r.started
            )
        ]
