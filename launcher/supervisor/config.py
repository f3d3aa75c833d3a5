"""``RunConfig``: everything ``sres run`` was asked to do, frozen and validated when built."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import ConfigError
from launcher.observability.straggler import StragglerConfig
from resilience.tiers import TierConfig
from resilience.contract.injections import Injection
from resilience.contract import link, rank_env
from resilience.contract.elastic_config import ElasticConfig
from resilience.errors import ElasticConfigError


@dataclass(frozen=True)
class RunConfig:
    """Everything ``sres run`` was asked to do; validated when built."""

    command: tuple[str, ...]
    nodes: int
    procs_per_node: int = 1
    spares: int = 0
    standby: int = 0
    """Warm standby processes per node holding ranks: a rank whose process dies on a healthy
    node is taken over by one, with its imports and warm-up already paid (a cold start of
    Python and torch costs seconds; taking over, a re-formation)."""
    fork_server: bool = True
    """Rank processes are forked from their machine's fork server (the script imported once,
    first-use costs paid) rather than started cold, from the run's first start on."""
    injections: tuple[Injection, ...] = ()
    log_dir: Path = Path("sres-logs")
    backend: str = rank_env.BACKEND
    hang_timeout_s: float = 30.0
    heartbeat_s: float = rank_env.HEARTBEAT_S
    reform_timeout_s: float = rank_env.REFORM_TIMEOUT_S
    startup_timeout_s: float = 120.0
    max_restarts: int = 10
    replication_factor: int = rank_env.REPLICATION_FACTOR
    copy_pace: float = rank_env.COPY_PACE
    node_fault_after: int = 2
    """Process faults on one node after which the node itself counts as bad and is replaced."""
    max_requeues: int | None = 3
    """Requeues of the Slurm job (``SLURM_RESTART_COUNT``) after which a fault ends the job;
    None: no cap of ours (Slurm's ``MaxBatchRequeue`` still applies). Time-limit requeues are
    left out of this count when ``max_timeout_requeues`` caps them apart."""
    max_timeout_requeues: int | None = None
    """Requeues at the job's time limit allowed (submitit's ``max_num_timeout``); None: they
    count as any requeue."""
    restart_count: int = 0
    timeout_requeues: int = 0
    """Of ``restart_count``, the requeues made at the time limit (read from the run's events)."""
    preempt_signal: str = rank_env.PREEMPT_SIGNAL
    preempt_save_timeout_s: float = 60.0
    tiers: TierConfig | None = None
    """Checkpoint tiers (RAM, neighbour, persistent) and the job id they are filed under."""
    metrics_port: int | None = None
    """Serve live metrics (Prometheus text) on this port; 0: any free port (the ``metrics`` event
    says which)."""
    metrics_addr: str = "127.0.0.1"
    metrics_textfile: Path | None = None
    """Also write them here, replaced atomically, for node_exporter's textfile collector."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """When a rank's compute time makes it a straggler, and what is done about it."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """How far the world may shrink and grow; bounds filled in for ``nodes`` when built."""
    rank_threads: int | None = None
    """``OMP_NUM_THREADS`` each rank gets (the user set none and ranks share a machine:
    :mod:`launcher.run.rank_threads`); None: the ranks inherit the environment as it is."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no training command given: sres run --nodes N -- python train.py")
        if self.nodes < 1:
            raise ConfigError(f"--nodes must be at least 1 (got {self.nodes})")
        if self.procs_per_node < 1:
            raise ConfigError(f"--procs-per-node must be at least 1 (got {self.procs_per_node})")
        if self.spares < 0:
            raise ConfigError(f"--spares cannot be negative (got {self.spares})")
        if self.standby < 0:
            raise ConfigError(f"--standby cannot be negative (got {self.standby})")
        if self.max_restarts < 0:
            raise ConfigError("--max-restarts cannot be negative")
        if self.hang_timeout_s <= 2 * self.heartbeat_s:
            raise ConfigError(f"--hang-timeout must exceed two heartbeats ({2 * self.heartbeat_s:g} s)")
        if self.reform_timeout_s <= 0:
            raise ConfigError(f"--reform-timeout must be positive (got {self.reform_timeout_s:g})")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {self.metrics_port}: a port is 0..65535 (0: any free one)")
        text = self.metrics_textfile
        if text is not None and (str(text) in ("", ".") or Path(text).is_dir()):
            raise ConfigError(f"--metrics-textfile {str(text)!r}: name a file (a *.prom), not a directory")
        if self.replication_factor < 1:
            raise ConfigError("the replication factor must be at least 1")
        if not 0 <= self.copy_pace < 1:
            raise ConfigError(f"--copy-pace {self.copy_pace:g}: a share of the step, at least 0 and below 1")
        if self.node_fault_after < 1:
            raise ConfigError("--node-fault-after must be at least 1")
        if self.max_requeues is not None and self.max_requeues < 0:
            raise ConfigError("--max-requeues cannot be negative")
        if self.max_timeout_requeues is not None and self.max_timeout_requeues < 0:
            raise ConfigError("--max-timeout-requeues cannot be negative")
        if self.preempt_signal_name == "SIGUSR1":
            raise ConfigError(
                "--preempt-signal USR1 is taken: NCCL may use SIGUSR1; use USR2 (the default) or TERM"
            )
        if not hasattr(signal, self.preempt_signal_name):
            raise ConfigError(f"--preempt-signal {self.preempt_signal}: not a signal name")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"unknown backend {self.backend!r}: gloo or nccl")
        try:
            object.__setattr__(self, "elastic", self.elastic.for_run(self.nodes))
        except ElasticConfigError as err:
            raise ConfigError(str(err)) from None
        for inj in self.injections:
            if inj.node is not None and not 0 <= inj.node < self.nodes:
                raise ConfigError(f"--inject {inj.spec}: there are nodes 0..{self.nodes - 1}")
            if inj.node is None and not 0 <= (inj.rank or 0) < self.world_size:
                raise ConfigError(f"--inject {inj.spec}: there are ranks 0..{self.world_size - 1}")

    @property
    def beat_s(self) -> float:
        """Seconds between each rank's heartbeats: ``heartbeat_s`` up to ~500 rank processes,
        longer past that (:func:`resilience.contract.link.beat_period`)."""
        nodes = max(self.nodes, self.elastic.max_nodes or self.nodes) + self.spares
        processes = nodes * (self.procs_per_node + self.standby)
        return link.beat_period(self.heartbeat_s, processes, self.hang_timeout_s)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def preempt_signal_name(self) -> str:
        return rank_env.signal_name(self.preempt_signal)
