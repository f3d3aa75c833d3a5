"""A ``RunRequest`` made into the supervisor's configs: ``RunConfig`` and, in it, the tier,
elastic and straggler configs. No side effects (``supervise`` prints and writes): the facts of
the environment (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``) and the clock come in as arguments.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.straggler import StragglerConfig
from launcher.run import rank_threads
from launcher.run.options import RunOptions, passed_on
from launcher.run.request import RunRequest, flag
from launcher.supervisor.config import RunConfig
from resilience.contract.elastic_config import ElasticConfig, ElasticConfigError
from resilience.contract.injections import Injection
from resilience.contract.run_dir import RunDir
from resilience.tiers import TierConfig, TierConfigError, default_job_id
from resilience.tiers.persistent import other_jobs

ELASTIC_KEYS = passed_on("elastic")
"""Option -> its ElasticConfig key, as the options declare."""


def log_dir_for(request: RunRequest, environ: Mapping[str, str], now: float) -> Path:
    """The run's log dir: the request's, else ``sres-runs/job-<id>`` in a Slurm job (a requeued
    job keeps its id, so its log dir and its requeue count), else ``sres-runs/run-<time>``."""
    if request.options.log_dir is not None:
        return request.options.log_dir
    job_id = environ.get("SLURM_JOB_ID")
    if request.placement == "srun" and job_id:
        return Path(f"sres-runs/job-{job_id}")
    return Path(time.strftime("sres-runs/run-%Y%m%d-%H%M%S", time.localtime(now)))


def private_log_dir(path: Path) -> Path:
    """The log dir, created mode 0700 or adopted only when it is the user's own directory: it
    holds the command line, the control token and the ranks' output."""
    from resilience.private_paths import NotPrivate, check_ancestors, private_dir

    try:
        check_ancestors(path)
        return private_dir(path)
    except NotPrivate as err:
        raise ConfigError(f"log dir: {err}; a run's log dir must be the user's own") from None


def injections(request: RunRequest) -> tuple[tuple[Injection, ...], list[str]]:
    """The request's faults to inject and, for seeded random ones, their schedules in words."""
    from resilience.agent import fault_schedule
    from resilience.contract.injections import InjectSpecError

    try:
        return fault_schedule.injections_from(list(request.options.inject), request.world_size)
    except InjectSpecError as err:
        raise ConfigError(str(err)) from None


def run_config(
    request: RunRequest,
    log_dir: Path,
    injected: tuple[Injection, ...],
    environ: Mapping[str, str],
    restart_count: int | None = None,
) -> RunConfig:
    """Everything the supervisor needs, validated (``RunConfig`` refuses what does not hold). The
    options declared with a ``config`` field go there as they are; the rest are read by hand, here
    (a value derived: ``fork_server``, the injections, the tiers' settings that depend on each
    other) or by ``supervise`` (what the placement takes: the capacity options).
    ``restart_count``: the runs of this job before this one; None: Slurm's count (a local run's: 0)."""
    o = request.options
    if restart_count is None:
        restart_count = int(environ.get("SLURM_RESTART_COUNT") or 0)
    return RunConfig(
        command=request.command,
        nodes=request.nodes,
        procs_per_node=request.procs_per_node,
        spares=request.spares,
        fork_server=not o.no_fork_server,
        injections=injected,
        log_dir=log_dir,
        max_restarts=request.max_restarts,
        restart_count=restart_count,
        timeout_requeues=timeout_requeues(log_dir, restart_count),
        tiers=tier_config(o, log_dir, environ),
        elastic=elastic_config(o),
        straggler=straggler_config(o),
        rank_threads=rank_threads.default_threads(environ, ranks_per_machine(request)),
        **{key: getattr(o, name) for name, key in passed_on("").items()},
    )


def ranks_per_machine(request: RunRequest) -> int:
    """Rank processes that share one machine's cores in this run."""
    return rank_threads.ranks_per_machine(
        request.placement, request.nodes, request.procs_per_node, request.spares
    )


def tier_config(options: RunOptions, log_dir: Path, environ: Mapping[str, str]) -> TierConfig | None:
    """The run's TierConfig: RAM and neighbour tiers on by default; the persistent tier every
    10th commit when only its directory is given; the YAML file under the flags."""
    if options.no_tiers:
        return None
    persist_every = options.persist_every
    if options.persistent_dir and persist_every is None and not options.tier_config:
        persist_every = 10
    flags = {
        "job_id": options.job_id or default_job_id(environ, log_dir),
        "persistent_dir": options.persistent_dir,
        "persist_every": persist_every,
        "ram_every": options.ram_every,
        "budget": None if options.protection_budget is None else options.protection_budget / 100,
    }
    try:
        if options.tier_config:
            config = TierConfig.from_yaml(options.tier_config, **flags)
        else:
            config = TierConfig.from_mapping({}, **flags)
    except (TierConfigError, ValueError) as err:
        raise ConfigError(f"tier settings: {err}") from None
    refuse_another_jobs_directory(config)
    return config


def refuse_another_jobs_directory(config: TierConfig) -> None:
    """A persistent directory that holds another job's checkpoints is refused: this run's saves
    would land beside them at the same step numbers (step-S/rank-R), overwriting their
    manifests, and a restore skips them (another job's) without a word. Two runs that share a
    directory share a job id (a requeued job keeps it; ``--job-id`` names it)."""
    if not config.persistent_dir:
        return
    others = other_jobs(Path(config.persistent_dir), config.job_id)
    if others:
        job, steps = next(iter(others.items()))
        raise ConfigError(
            f"--persistent-dir {config.persistent_dir} holds job {job}'s checkpoints (steps "
            f"{min(steps)}-{max(steps)}) and this run is job {config.job_id}: its saves would overwrite "
            f"them; give this run a directory of its own, or --job-id {job} to resume that job"
        )


def elastic_config(options: RunOptions) -> ElasticConfig:
    """The run's ElasticConfig: the YAML file, then the options given; errors name the flags."""
    given = {key: getattr(options, name) for name, key in ELASTIC_KEYS.items()}
    try:
        base = ElasticConfig.from_yaml(options.elastic_config) if options.elastic_config else ElasticConfig()
        return base.updated({k: v for k, v in given.items() if v is not None}, "elastic settings")
    except ElasticConfigError as err:
        text = str(err)
        for name, key in ELASTIC_KEYS.items():
            text = text.replace(key, flag(name))
        raise ConfigError(text) from None


def straggler_config(options: RunOptions) -> StragglerConfig:
    try:
        given = {key: getattr(options, name) for name, key in passed_on("straggler").items()}
        return StragglerConfig(**given)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def timeout_requeues(log_dir: Path, restart_count: int) -> int:
    """Requeues this job made at its time limit: its earlier runs' ``requeue`` events in the
    same log dir (a requeued job keeps its id, so its log dir)."""
    path = RunDir(log_dir).events
    if restart_count == 0 or not path.exists():
        return 0
    return sum(1 for e in read_events(path).of("requeue") if e.get("cause") == "time-limit")
