"""``RunOptions``: every option of ``sres run`` and ``sres srun``, each declared once as a field with
its flag, ``SRES_*`` variable, help, doc line and where it acts (``launcher.run.option_spec``).

The command line (``launcher.cli.run_options``), the environment table
(``launcher.run.environment``), the supervisor's configs (``launcher.run.configs``), what ranks are
given (the supervisor's ``_rank_env``) and the reference pages (``docs/generate.py``) are all made
from these fields, so adding an option is one field here and its use. Defaults are written out
(unit tests keep them equal to ``RunConfig``'s and ``StragglerConfig``'s): the signal latch imports
this module before torch, so it imports only the standard library and torch-free launcher modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.run.option_spec import choices_of, declared, flag, option
from launcher.run.typed_fields import read_fields

ELASTIC = "elastic (the world shrinks and grows; off unless --min-nodes or --max-nodes differ from --nodes)"
"""The ``--help`` group of the elastic options."""
_IN_SLURM = "in a Slurm job: "
_ELASTIC_MODULE = "resilience.contract.elastic_config:"


def _elastic(key: str | None, **declaration: Any) -> Any:
    """An elastic option: ``key`` is its ``ElasticConfig`` key (None: read by hand), whose default
    its help shows (the option's own is None: the YAML file's, else ``ElasticConfig``'s, decides);
    it is in the elastic ``--help`` group, and ranks get it in their ``ElasticConfig``."""
    config = f"elastic.{key}" if key else None
    shown = f"{_ELASTIC_MODULE}ElasticConfig.{key}" if key else None
    return option(None, group=ELASTIC, rank="elastic", config=config, shown=shown, **declaration)


@dataclass(frozen=True)
class RunOptions:
    """How a run is supervised: one field per option (by its Python name: ``--hang-timeout`` ->
    ``hang_timeout``), in ``--help``'s order, with the command line's defaults and units (seconds,
    counts)."""

    # faults, and where the logs go
    inject: tuple[str, ...] = option(
        (),
        doc="faults to inject, SPEC;SPEC (--inject on the command line replaces them)",
        help="fault to inject (repeatable), e.g. kill:rank=R:step=S or node:N:step=S; kinds: {default}, or "
        "random:...; '--inject help' says each one's spec and effect; also SRES_INJECT='SPEC;SPEC'",
        metavar="SPEC",
        cli="inject",
        shown="resilience.contract.injections:KINDS",
        rank="injections",
    )
    log_dir: Path | None = option(
        None,
        doc="where events.jsonl and rank logs go",
        help="where events.jsonl and rank logs go (default $SRES_LOG_DIR, else "
        "sres-runs/job-<id> in a Slurm job, else sres-runs/run-<time>)",
        rank="log_dir",
    )
    # how ranks are watched and recovered
    standby: int = option(
        0,
        doc="warm standby processes per node",
        help="warm standby processes per node (default 0): a rank whose process dies on a healthy node is "
        "taken over by one, without Python and torch starting on the recovery path (costs one idle "
        "process's memory per node)",
        metavar="N",
        config="standby",
    )
    no_fork_server: bool = option(
        False,
        doc="start every rank cold, without a fork server (1/true/yes)",
        help="start every rank process cold (Python, torch and the script's imports on the recovery path) "
        "instead of forking it from its machine's fork server, which imports the script once "
        "(docs/guide/fork-server.md says what a script must not start before resilience.run)",
    )
    backend: str = option(
        "gloo",
        doc="torch.distributed backend: gloo or nccl",
        help="torch.distributed backend",
        choices=("gloo", "nccl"),
        config="backend",
        rank="backend",
    )
    hang_timeout: float = option(
        30.0,
        doc="seconds without heartbeat before a rank is declared hung",
        help="seconds without heartbeat before a rank is declared hung (default {default:g})",
        config="hang_timeout_s",
    )
    reform_timeout: float = option(
        60.0,
        doc="seconds to wait for every rank of a new generation",
        help="seconds to wait for every rank of a new generation (default {default:g})",
        config="reform_timeout_s",
        rank="reform_timeout_s",
    )
    node_fault_after: int = option(
        2,
        doc="process faults on one node after which the node is drained and replaced",
        help="process faults on one node after which the node is drained and replaced (default {default})",
        config="node_fault_after",
    )
    # how sharded state is copied to buddies after each commit
    replication_factor: int = option(
        2,
        doc="copies of each sharded state shard",
        help="copies of each sharded state shard (default {default})",
        config="replication_factor",
        rank="replication_factor",
    )
    copy_pace: float = option(
        0.5,
        doc="share of the recent step time each buddy copy is spread over (0: at once)",
        help="share of the recent step time each buddy copy is spread over, so that it leaves while "
        "the host idles and ends within the step (default {default:g}; 0: sent at once)",
        metavar="SHARE",
        config="copy_pace",
        rank="copy_pace",
    )
    # requeues (Slurm batch jobs)
    max_requeues: int | None = option(
        3,
        doc="requeues of the whole job allowed ('none': Slurm's MaxBatchRequeue only)",
        help="in a Slurm batch job: requeue at most this many times (SLURM_RESTART_COUNT; "
        "'none': no cap of ours, Slurm's MaxBatchRequeue still applies; default {default})",
        cli="count-or-none",
        config="max_requeues",
    )
    max_timeout_requeues: int | None = option(
        None,
        doc="requeues at the job's time limit allowed, counted apart",
        help="requeues at the job's time limit allowed, counted apart from --max-requeues (a signal "
        "in the last 10 minutes or 20% of the limit is the limit's; submitit's max_num_timeout); "
        "default: counted with the others",
        cli="count-or-none",
        config="max_timeout_requeues",
    )
    preempt_signal: str = option(
        "USR2",
        doc="signal that means 'save and requeue'; held from the process's first moment",
        help="signal that means 'save and requeue' (default {default}; USR1 is refused: NCCL may use it)",
        config="preempt_signal",
        rank="preempt_signal",
    )
    # watching
    metrics_port: int | None = option(
        None,
        doc="serve live metrics on this port (0: a free one)",
        help="serve live metrics (Prometheus text) on this port; 0 picks a free one (see the metrics event)",
        config="metrics_port",
    )
    metrics_addr: str = option(
        "127.0.0.1",
        doc="address the metrics endpoint binds",
        help="address the metrics endpoint binds (default {default}: this host only)",
        config="metrics_addr",
    )
    metrics_textfile: Path | None = option(
        None,
        doc="also write the metrics to this file",
        help="also write the metrics to this file, replaced atomically (node_exporter textfile collector)",
        config="metrics_textfile",
    )
    straggler_factor: float = option(
        1.5,
        doc="a rank this many times the median step time is slow",
        help="a rank computing this many times the median per step is slow (default {default:g})",
        config="straggler.factor",
    )
    straggler_steps: int = option(
        20,
        doc="...for this many steps in a row",
        help="...for this many steps in a row: a straggler event (default {default}; past 512 ranks, "
        "counted in whole windows of ceil(N/512) steps)",
        config="straggler.steps",
    )
    straggler_action: str = option(
        "none",
        doc="what a straggler causes: none (report it) or replace",
        help="replace: treat a straggler's node as faulty (drained under Slurm) and move its ranks to a "
        "spare (default: report it)",
        choices="launcher.observability.straggler:ACTIONS",
        config="straggler.action",
    )
    # capacity: where a Slurm run's nodes come from beyond its allocation
    no_grow: bool = option(
        False,
        doc="never add nodes (1/true/yes)",
        help=_IN_SLURM + "never add nodes (satellites or expansion); requeue when no spare node is left",
    )
    grow_by: str = option(
        "satellite",
        doc="how the run gains a node: satellite or expansion",
        help=_IN_SLURM + "how the run gains a node when it has no spare or idle one, and how it grows "
        "into idle nodes below --max-nodes: a one-node job of yours whose node runs rank steps "
        "(satellite, the default), or job expansion where the cluster permits it (sres doctor says)",
        choices="launcher.slurm.satellites:GROW_BY",
    )
    all_satellites: bool = option(
        False,
        doc="every node that holds ranks is a satellite (1/true/yes)",
        help=_IN_SLURM + "every node that holds ranks (and every spare) is a satellite; this job's own "
        "node runs only the supervisor and its store, so losing any training node, rank 0's "
        "included, never loses them (submit this job to a small CPU partition; "
        "sbatch_templates/train_supervisor_apart.sbatch)",
    )
    lend_partition: str | None = option(
        None,
        doc="the partition satellites are submitted to",
        help=_IN_SLURM + "the partition satellites are submitted to (default: the job's own), e.g. a "
        "low-priority preemptible one whose idle nodes the scheduler lends and takes back",
        metavar="P",
    )
    lend_account: str | None = option(
        None,
        doc="the account satellites are charged to",
        help=_IN_SLURM + "the account satellites are charged to (default: the job's own), e.g. a team's "
        "borrowing account (sres governance: TEAM_borrow), whose QOS Slurm preempts when the nodes' "
        "owner needs them",
        metavar="A",
    )
    repair_after: float | None = option(
        None,
        doc="local runs: a drained simulated node is healthy again after this many seconds",
        help="local runs: a drained simulated node comes back healthy S seconds later and refills the "
        "spares (on Slurm, a node resumed by an admin or the health hooks does); default: never",
        metavar="S",
    )
    # checkpoint tiers (launcher.run.configs.tier_config reads them: defaults depend on each other)
    persistent_dir: str | None = option(
        None,
        doc="persistent checkpoint tier (shared filesystem)",
        help="persistent checkpoint tier (shared filesystem); off by default",
        rank="tiers",
    )
    persist_every: int | None = option(
        None,
        doc="write every K-th commit to the persistent tier",
        help="write every K-th commit to --persistent-dir (default 10 when it is given)",
        metavar="K",
        rank="tiers",
    )
    job_id: str | None = option(
        None,
        doc="the id the RAM and persistent tiers are filed under",
        help="files the RAM/persistent tiers under this id; a new run with the same id "
        "restores from them (default: SLURM_JOB_ID, else derived from --log-dir)",
        rank="tiers",
    )
    ram_every: int | None = option(
        None,
        doc="RAM and neighbour tiers every N-th step",
        help="RAM and neighbour tiers every N-th step (default 1: every commit)",
        metavar="N",
        rank="tiers",
    )
    protection_budget: float | None = option(
        None,
        doc="percent of step time the RAM and neighbour tiers' copies may take",
        help="percent of step time the RAM and neighbour tiers' copies may take; their cadence is "
        "chosen online to stay within it (default 3; 0: every commit whatever it costs)",
        metavar="PCT",
        rank="tiers",
    )
    tier_config: Path | None = option(
        None, doc="YAML file of tier settings", help="YAML file of tier settings (flags win)", rank="tiers"
    )
    no_tiers: bool = option(
        False,
        doc="no checkpoint tiers at all (1/true/yes)",
        help="no checkpoint tiers at all (peers' memory only)",
        rank="tiers",
    )
    # elastic (None: ElasticConfig's default, or the YAML file's)
    min_nodes: int | None = _elastic(
        "min_nodes",
        doc="the world never shrinks below this",
        help="the world never shrinks below this (default: --nodes)",
    )
    max_nodes: int | None = _elastic(
        "max_nodes",
        doc="the world never grows above this",
        help="the world never grows above this (default: --nodes)",
    )
    on_no_spare: str | None = _elastic(
        "on_no_spare",
        doc="a node lost with no spare: shrink, wait, requeue or fail",
        help="a node lost with no spare: shrink the world (default when --min-nodes < --nodes, or while "
        "the world is above --min-nodes), wait for a node up to --resize-timeout, requeue (Slurm), or fail",
        choices=_ELASTIC_MODULE + "ON_NO_SPARE",
    )
    resize_step: int | None = _elastic(
        "resize_step", doc="the world changes by multiples of K nodes", metavar="K"
    )
    resize_sizes: str | None = _elastic(
        "resize_sizes", doc="the only node counts allowed, e.g. 2,4,8", metavar="N,N,..."
    )
    grow_snooze: float | None = _elastic(
        "grow_snooze_s",
        doc="no growth within S s of a restart or resize",
        help="no growth into free capacity within S s of a restart or resize (default {default:g})",
        metavar="S",
    )
    resize_timeout: float | None = _elastic(
        "resize_timeout_s",
        doc="how long 'wait' holds for a node",
        help="how long 'wait' holds for a node before requeue/failure (default {default:g})",
        metavar="S",
    )
    drain_grace: float | None = _elastic(
        "drain_grace_s",
        doc="how long ranks may take to reach a step boundary for a resize",
        help="how long ranks may take to reach a step boundary for a resize (default {default:g})",
        metavar="S",
    )
    batch_policy: str | None = _elastic(
        "batch_policy",
        doc="a world that does not divide the global batch: keep-closest or fail",
        help="a world that does not divide the global batch: use the closest one it divides, or fail "
        "(default keep-closest; resilience.ElasticSampler)",
        choices=_ELASTIC_MODULE + "BATCH_POLICIES",
    )
    lr_scaling: str | None = _elastic(
        "lr_scaling",
        doc="LR scale for a changed global batch",
        help="LR scale for a changed global batch (default linear)",
        choices=_ELASTIC_MODULE + "LR_SCALINGS",
    )
    elastic_config: Path | None = _elastic(
        None,
        doc="YAML file of the elastic settings",
        help="YAML file of these settings (ElasticConfig keys; flags win)",
    )

    def __post_init__(self) -> None:
        read_fields(self, flag)
        for f, spec in declared(RunOptions):
            value, allowed = getattr(self, f.name), choices_of(spec)
            if value is not None and allowed is not None and value not in allowed:
                raise ConfigError(f"{flag(f.name)} {value!r}: one of {', '.join(allowed)}")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RunOptions:
        """Options from name -> value (text, as the environment gives it, or Python values)."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown option {flag(unknown[0])}")
        return cls(**values)


def passed_on(into: str) -> dict[str, str]:
    """Option -> its field in ``into`` (``""``: ``RunConfig``; ``"elastic"``, ``"straggler"``: that
    sub-config), for every option that goes there unchanged."""
    found = {}
    for f, spec in declared(RunOptions):
        where, _, key = (spec.config or "").rpartition(".")
        if spec.config and where == into:
            found[f.name] = key
    return found


def rank_fields() -> tuple[str, ...]:
    """The ``RunConfig`` fields the supervisor gives every rank as they are (``RankEnv``'s of the
    same name): options declared with the same ``config`` and ``rank``."""
    return tuple(spec.rank for _, spec in declared(RunOptions) if spec.rank and spec.rank == spec.config)
