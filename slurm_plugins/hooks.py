"""The entry points Slurm runs: ``Prolog=``, ``Epilog=``, ``HealthCheckProgram=``.

Each one reads Slurm's environment, runs the configured checks under the runner's budget,
logs one JSON line per check, decides (pure, :mod:`slurm_plugins.health_actions`) and acts through
SlurmClient. Exit codes follow Slurm's meaning: the prolog and epilog exit non-zero only when
a check failed (do not run jobs here; Slurm then requeues the job elsewhere, see
``nohold_on_prolog_fail``); the health-check program always exits 0, its effect is the drain.

What Slurm 22.05 gives these programs (seen on the test cluster): the prolog and epilog get
``SLURM_JOB_ID``, ``SLURM_NODELIST`` (not ``SLURM_JOB_NODELIST``), ``SLURMD_NODENAME``,
``SLURM_CLUSTER_NAME`` and ``SLURM_CONF``, but no ``PATH``; the health-check program gets
only ``SLURMD_NODENAME`` (so its wrapper exports ``SLURM_CONF``).

A config that does not validate fails open (jobs still start, the log says why) or closed, as
its ``on_config_error`` says. One health run per node at a time: a run that finds the previous
one (deep checks) still going leaves. The epilog also removes the job's RAM tier
(``resilience.tiers.cleanup_job``, as the job's user) and its leftover processes.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import PrivilegeError, SlurmError
from launcher.privileges import call_as
from slurm_plugins import health_config
from slurm_plugins.health_actions import Kind, NodeDecision, decide, perform
from slurm_plugins.checks import CheckContext, CheckResult, enabled_checks
from slurm_plugins.checks.processes import kill_job_processes
from slurm_plugins.deep import deep_checks
from slurm_plugins.errors import HealthConfigError
from slurm_plugins.health_config import HealthConfig
from slurm_plugins.health_log import HealthLog
from slurm_plugins.runner import run_checks, run_in_turn

HOOKS = ("prolog", "epilog", "health")
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


@dataclass(frozen=True)
class HookEnv:
    """Slurm's environment as the hooks need it, read in one place."""

    node: str
    job_id: str | None
    nodelist: str | None
    cluster: str | None
    slurm_conf: Path
    job_uid: int | None = None
    """The job's user (``SLURM_JOB_UID``): the epilog cleans that user's files as that user."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "HookEnv":
        slurm_conf = Path(env.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
        return cls(
            node=env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
            job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None,
            nodelist=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None,
            # The health-check program is not told the cluster: slurm.conf is.
            cluster=env.get("SLURM_CLUSTER_NAME") or _cluster_name(slurm_conf),
            slurm_conf=slurm_conf,
            job_uid=int(env["SLURM_JOB_UID"]) if env.get("SLURM_JOB_UID", "").isdigit() else None,
            env=dict(env),
        )

    env: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def context(self, config: HealthConfig) -> CheckContext:
        return CheckContext(config, self.node, self.cluster, self.job_id, self.slurm_conf, self.env)


def load_config(explicit: str | None, env: Mapping[str, str]) -> tuple[Path, HealthConfig]:
    path, required = health_config.config_path(explicit, env)
    return path, health_config.load(path, required)


def run_hook(kind: str, config_arg: str | None, env: Mapping[str, str], verify: bool = False) -> int:
    """Run one hook; return its exit code."""
    hook = HookEnv.from_env(env)
    try:
        path, config = load_config(config_arg, env)
    except HealthConfigError as err:
        return _config_error(kind, hook, err, verify)
    if verify:
        print(f"sres hooks {kind}: config {path} valid; {len(enabled_checks(config))} checks on {hook.node}")
        return 0
    log = HealthLog(
        config.log.file, config.log.syslog, hook=kind, node=hook.node, job=hook.job_id, nodelist=hook.nodelist
    )
    lock = _health_lock(config, hook.node, log) if kind == "health" else None
    if kind == "health" and lock is None:
        log.close()
        return 0
    try:
        if config.ram_root:
            os.environ["SRES_RAM_ROOT"] = config.ram_root
        if kind == "epilog" and hook.job_id:
            _clean_job(hook, log, config.budget.cleanup_s)
        ctx = hook.context(config)
        results = run_checks(enabled_checks(config), ctx, config.budget.per_check_s, config.budget.total_s)
        _log_results(log, results)
        failed = any(r.failed for r in results)
        if not failed and kind != "health":
            return 0
        client, node = _slurm_view(hook, log, config.budget.slurm_s)
        may_resume = False
        if kind == "health" and not failed and node is not None and node.drained_by_us:
            if config.deep.before_resume:
                deep = run_deep(ctx)
                _log_results(log, deep, "deep_check")
                results, failed = results + deep, any(r.failed for r in deep)
            may_resume = not failed
        decision = decide(results, node, config.actions, may_resume)
        _act(decision, client, hook, log)
        return 1 if failed and kind != "health" else 0
    finally:
        log.close()
        if lock is not None:
            os.close(lock)


def run_local(config_arg: str | None, env: Mapping[str, str], deep: bool = False) -> list[CheckResult]:
    """``sres hooks check`` / ``deep-check``: run the checks here, act on nothing."""
    _, config = load_config(config_arg, env)
    ctx = HookEnv.from_env(env).context(config)
    if deep:
        return run_deep(ctx)
    return run_checks(enabled_checks(config), ctx, config.budget.per_check_s, config.budget.total_s)


def run_deep(ctx: CheckContext) -> list[CheckResult]:
    return run_in_turn(deep_checks(), ctx, ctx.config.deep.per_check_s, ctx.config.deep.total_s)


def render(results: list[CheckResult]) -> str:
    rows = [("check", "status", "fault", "time s", "detail")]
    for r in results:
        rows.append(
            (r.check, r.status.value, r.fault.value if r.failed else "", f"{r.duration_s:.2f}", r.detail)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows
    )


def _config_error(kind: str, hook: HookEnv, err: HealthConfigError, verify: bool) -> int:
    """A bad config: one clear line, then fail open (jobs still run) or closed, as it says."""
    print(f"sres: error: {err}", file=sys.stderr)
    if verify:
        return 1
    try:
        raw = health_config.read_raw(Path(err.source))
    except HealthConfigError:
        raw = {}
    policy = health_config.failure_policy(raw)
    # What can still be read from the broken file is used: where to log, the RAM-tier root.
    log = HealthLog(
        _raw_str(raw, "log", "file") or health_config.LogConfig.file,
        True,
        hook=kind,
        node=hook.node,
        job=hook.job_id,
    )
    if _raw_str(raw, "ram_root"):
        os.environ["SRES_RAM_ROOT"] = _raw_str(raw, "ram_root") or ""
    try:
        if policy == "open":
            print(
                f"sres: CONFIG ERROR on {hook.node}: no health checks ran; failing OPEN "
                "(on_config_error: open): jobs still start here. Fix the config.",
                file=sys.stderr,
            )
            log.event("config_error", status="error", policy="open", error=str(err))
            if kind == "epilog" and hook.job_id:
                _clean_job(hook, log)
            return 0
        log.event("config_error", status="error", policy="closed", error=str(err))
        if kind == "health":
            return 0  # the prolog of the next job drains; a broken config must not churn nodes
        client, node = _slurm_view(hook, log, health_config.Budget.slurm_s)
        reason = f"sres: config: {err.key or err.problem}"[:200]
        if node is None or not node.drained or node.drained_by_us:
            _act(NodeDecision(Kind.DRAIN, reason), client, hook, log)
        return 1
    finally:
        log.close()


def _raw_str(raw: object, *keys: str) -> str | None:
    for key in keys:
        raw = raw.get(key) if isinstance(raw, dict) else None
    return raw if isinstance(raw, str) and raw else None


def _health_lock(config: HealthConfig, node: str, log: HealthLog) -> int | None:
    """One health-check run per node at a time: slurmd starts the program every interval even
    while the previous run (deep checks) still goes on. Returns the held lock's fd, or None."""
    path = Path(config.state_dir) / f"health-{node}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        log.event("lock", status="warning", detail=f"cannot open {path} ({err.strerror}); running unlocked")
        return os.open(os.devnull, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        log.event("lock", status="skipped", detail="previous health-check run still going")
        return None
    return fd


def _clean_job(hook: HookEnv, log: HealthLog, timeout_s: float = health_config.Budget.cleanup_s) -> None:
    """The epilog's cleanup: the job's leftover processes, and its RAM-tier files, as the job's
    user in a child process that is stopped after ``timeout_s`` (:mod:`launcher.privileges`),
    and only in RAM roots that user owns."""
    from resilience.tiers.job_cleanup import cleanup_user_job

    killed = kill_job_processes(hook.job_id or "", hook.job_uid, hook.node, hook.cluster)
    removed = False
    if hook.job_uid is None:
        log.event("cleanup", status="warning", detail="no SLURM_JOB_UID: RAM tier left alone")
    else:
        uid, job = hook.job_uid, hook.job_id or ""
        try:
            removed = call_as(uid, lambda: cleanup_user_job(job, uid), timeout_s=timeout_s)
        except (OSError, ValueError, PrivilegeError) as err:
            log.event("cleanup", status="fail", detail=f"RAM tier: {err}")
    log.event("cleanup", status="ok", killed=killed, ram_tier_removed=removed)


def _slurm_view(hook: HookEnv, log: HealthLog, timeout_s: float):
    from launcher.slurm.client import SlurmClient, driver_named

    try:
        client = SlurmClient.create(driver_named(hook.env), timeout_s=timeout_s)
        return client, client.node(hook.node)
    except SlurmError as err:
        log.event("slurm", status="error", detail=str(err))
        return None, None


def _act(decision: NodeDecision, client, hook: HookEnv, log: HealthLog) -> None:
    if decision.kind is Kind.NONE or client is None:
        log.event("action", action=decision.kind.value, reason=decision.reason, why=decision.why)
        return
    try:
        acted = perform(decision, client, hook.node)
        log.event("action", action=decision.kind.value, reason=decision.reason, why=decision.why, nodes=acted)
    except SlurmError as err:
        log.event(
            "action", status="error", action=decision.kind.value, reason=decision.reason, detail=str(err)
        )
        print(f"sres: error: could not {decision.kind.value} {hook.node}: {err}", file=sys.stderr)


def _log_results(log: HealthLog, results: list[CheckResult], event: str = "check") -> None:
    for r in results:
        log.event(event, **r.to_json())


def _cluster_name(conf: Path) -> str | None:
    try:
        for line in conf.read_text(errors="replace").splitlines():
            key, sep, value = line.split("#", 1)[0].partition("=")
            if sep and key.strip().lower() == "clustername":
                return value.strip()
    except OSError:
        pass
    return None
