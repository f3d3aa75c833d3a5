"""The supervisor -> rank contract: how a rank process is told who it is and where to go.

:class:`RankEnv` is the only place that spells the ``SRES_*`` variables a rank is started
with: the supervisor builds one per process and passes ``to_environ()``; the rank reads it
back with ``from_environ()``. The defaults below are the defaults of the whole project (the
``sres`` command line and ``RunConfig`` import them).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resilience.contract import run_secret
from resilience.contract.injections import Injection, parse_env
from resilience.contract.elastic_config import ELASTIC_ENV, ElasticConfig
from resilience.errors import ElasticConfigError, OptionError, RankEnvError
from resilience.contract.tier_config import TIERS_ENV, TierConfig
from resilience.contract import slots

HEARTBEAT_S = 0.5
"""How often a rank bumps its heartbeat; the supervisor's hang timeout must exceed two."""
REFORM_TIMEOUT_S = 60.0
"""How long a new generation waits for every member while forming its process group."""
COLLECTIVE_TIMEOUT_S = 600.0
"""The process group's timeout once formed (faults are seen long before, by the supervisor)."""
REPLICATION_FACTOR = 2
"""Copies of each sharded state shard: its owner's and ``factor - 1`` buddies' on other nodes."""
COPY_PACE = 0.5
"""Share of the recent step time a buddy round's sends are spread over (0: sent at once):
copies that leave mostly while the host idles, and still end within the step."""
PREEMPT_SIGNAL = "USR2"
"""The signal that means "save and requeue" (USR1 is NCCL's)."""
BACKEND = "gloo"
"""The torch.distributed backend."""

FORK_SAFE_DEFAULTS = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
"""Given to every process of a run unless the user's environment sets them: a script that asks
``torch.cuda.is_available()`` before ``resilience.run`` (most do, to pick a device) would
otherwise start CUDA's driver (``cuInit``) in its node's fork server, and no rank forked from it
could use the GPU; with it torch asks NVML, which survives a fork."""

# field -> variable. Slurm's own SLURM_STEP_ID and the conventional LOCAL_RANK are read too.
_VARS = {
    "store_host": "SRES_STORE_HOST",
    "store_port": "SRES_STORE_PORT",
    "store_nonce": "SRES_STORE_NONCE",
    "slot": "SRES_SLOT",
    "node": "SRES_NODE",
    "local_rank": "SRES_LOCAL_RANK",
    "node_name": "SRES_NODE_NAME",
    "backend": "SRES_BACKEND",
    "injections": "SRES_INJECT",
    "heartbeat_s": "SRES_HEARTBEAT_S",
    "lease_s": "SRES_LEASE_S",
    "reform_timeout_s": "SRES_REFORM_TIMEOUT_S",
    "replication_factor": "SRES_REPLICATION_FACTOR",
    "copy_pace": "SRES_COPY_PACE",
    "liveness_port": "SRES_LIVENESS_PORT",
    "run_secret": run_secret.ENV,
    "preempt_signal": "SRES_PREEMPT_SIGNAL",
    "log_dir": "SRES_LOG_DIR",
    "reclaim_signal": "SRES_RECLAIM_SIGNAL",
    "tiers": TIERS_ENV,
    "elastic": ELASTIC_ENV,
}
RUN_OPTIONS = (
    "backend",
    "heartbeat_s",
    "reform_timeout_s",
    "collective_timeout_s",
    "replication_factor",
    "copy_pace",
    "tiers",
    "elastic",
    "deterministic_ddp",
    "restore_rng",
)
"""What ``resilience.run(train, **options)`` may override of what the supervisor configured."""


@dataclass(frozen=True)
class RankEnv:
    """How the supervisor configured this rank process; validated when built."""

    store_host: str
    """Host of the supervisor's TCPStore."""
    store_port: int
    """Port of the supervisor's TCPStore."""
    slot: str
    """This process's slot (``n<node>p<local>``, ``r<k>``, ``n<node>s<k>``): who it is to the supervisor."""
    store_nonce: str = ""
    """This supervisor incarnation's: with the secret, the store's key (``run_secret.store_key``)."""
    node: int = 0
    """The node's number in the run."""
    local_rank: int = 0
    """The rank's index on its node (``LOCAL_RANK`` too; a standby's comes with the plan)."""
    node_name: str = ""
    """The node's Slurm name; empty for a local run's simulated nodes."""
    backend: str = BACKEND
    injections: tuple[Injection, ...] = ()
    """Faults to inject (``--inject`` specs, separated by ``;``)."""
    heartbeat_s: float = HEARTBEAT_S
    lease_s: float = 0.0
    """How long the rank may act without the supervisor's echo (:mod:`resilience.contract.lease`);
    0: no lease (a run without a liveness connection)."""
    reform_timeout_s: float = REFORM_TIMEOUT_S
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S
    replication_factor: int = REPLICATION_FACTOR
    copy_pace: float = COPY_PACE
    """Share of the recent step time each buddy round's sends are spread over (0: at once)."""
    liveness_port: int = 0
    """The supervisor's port a rank holds a connection to, so that a lost node is seen at once (0: none)."""
    run_secret: str = field(default="", repr=False)
    """What proves a connection comes from the run (:mod:`resilience.contract.run_secret`); never printed."""
    preempt_signal: str = PREEMPT_SIGNAL
    log_dir: str = ""
    """The run's log directory (``events.jsonl``, rank logs, step times)."""
    reclaim_signal: str = ""
    """Set on a node lent to the run (a satellite): this signal means Slurm takes the node back
    (preemption signals steps first, then ends the job after its grace time)."""
    step_id: str = ""
    """Slurm's step id of this process (``SLURM_STEP_ID``, set by srun, not by us)."""
    tiers: TierConfig | None = None
    """The checkpoint tiers' settings (JSON); None: no tiers."""
    elastic: ElasticConfig | None = None
    """The run's resize policy; ranks use its batch keys (``batch_policy``, ``lr_scaling``)."""
    deterministic_ddp: bool = True
    """Give every DDP built in ``train`` a bucket-independent all-reduce (``resilience.ddp``'s),
    so a recovered run ends bitwise equal; only ``resilience.run(train, deterministic_ddp=False)``
    turns it off (a choice of the training code, not of the launcher)."""
    restore_rng: bool = True
    """Take each rank's random streams (Python, NumPy, torch CPU and CUDA) at every commit and set
    them again before the first step after a re-entry; ``resilience.run(train, restore_rng=False)``
    leaves them as ``train`` sets them (a loop whose steps draw no random numbers saves ~0.1 ms a
    commit)."""

    def __post_init__(self) -> None:
        if not self.slot:
            raise RankEnvError(f"{_VARS['slot']} is empty: this process was not started by sres")
        if not 0 < self.store_port < 65536:
            raise RankEnvError(f"{_VARS['store_port']}={self.store_port}: not a TCP port")
        if self.backend not in ("gloo", "nccl"):
            raise RankEnvError(f"backend {self.backend!r}: gloo or nccl")
        if min(self.heartbeat_s, self.reform_timeout_s, self.collective_timeout_s) <= 0:
            raise RankEnvError("heartbeat_s, reform_timeout_s and collective_timeout_s must be positive")
        if self.liveness_port and not run_secret.is_secret(self.run_secret):
            raise RankEnvError(
                f"{_VARS['run_secret']} is missing or malformed: this process was not started by sres"
            )
        if self.replication_factor < 1:
            raise RankEnvError(f"replication_factor {self.replication_factor}: at least 1")
        if not 0 <= self.copy_pace < 1:
            raise RankEnvError(f"copy_pace {self.copy_pace}: at least 0 and below 1")
        for what, name in (("preempt", self.preempt_signal), ("reclaim", self.reclaim_signal or "TERM")):
            if not hasattr(signal, signal_name(name)):
                raise RankEnvError(f"{what} signal {name!r}: not a signal name")

    @property
    def batch_producer(self) -> bool:
        """This process is its node's batch producer (``resilience.run(train, batches=...)``), not a rank."""
        return self.slot == slots.producer_slot(self.node)

    @property
    def fork_server(self) -> bool:
        """This process is its machine's fork server: it imports the script, then forks ranks."""
        return self.slot == slots.fork_server_slot(self.node)

    @property
    def preempt_signal_name(self) -> str:
        return signal_name(self.preempt_signal)

    @property
    def reclaim_signal_name(self) -> str:
        return signal_name(self.reclaim_signal)

    def to_environ(self) -> dict[str, str]:
        """The variables that give a rank process this configuration (``LOCAL_RANK`` too)."""
        env = {}
        for name, var in _VARS.items():
            value = getattr(self, name)
            if name == "injections":
                value = ";".join(i.spec for i in value)
            elif name in ("tiers", "elastic"):
                if value is None:
                    continue
                value = value.to_json()
            env[var] = str(value)
        env["LOCAL_RANK"] = str(self.local_rank)
        return env

    @classmethod
    def from_environ(cls, env: Mapping[str, str], **options: Any) -> "RankEnv | None":
        """This process's configuration, or None when no supervisor started it (plain torchrun).

        ``options`` (from ``resilience.run``) override the supervisor's; an unknown one is refused.
        """
        check_options(options)
        if _VARS["store_port"] not in env:
            return None
        try:
            values = _parse(env)
        except (KeyError, ValueError) as err:
            raise RankEnvError(f"bad rank environment from sres: {type(err).__name__}: {err}") from None
        values.update({k: v for k, v in options.items() if k not in ("tiers", "elastic")})
        if "tiers" in options:
            values["tiers"] = TierConfig.from_option(options["tiers"], values["tiers"], env)
        if "elastic" in options:
            values["elastic"] = elastic_option(options["elastic"], values["elastic"])
        return cls(**values)


def elastic_option(option: Any, configured: ElasticConfig | None) -> ElasticConfig:
    """``resilience.run(elastic={...})`` over what ``sres run`` configured. Only the batch keys
    act inside a rank; the supervisor has already decided the bounds, so a bound given here
    that differs from the run's is refused rather than silently ignored."""
    if isinstance(option, ElasticConfig):
        option = {f: getattr(option, f) for f in ("batch_policy", "lr_scaling")}
    if not isinstance(option, Mapping):
        raise OptionError(f"resilience.run(elastic=...): a dict of keys, got {type(option).__name__}")
    try:
        merged = (configured or ElasticConfig()).updated(option, "resilience.run(elastic=...)")
    except ElasticConfigError as err:
        raise OptionError(str(err)) from None
    for key in sorted(set(option) - {"batch_policy", "lr_scaling"}):
        if configured is not None and getattr(merged, key) != getattr(configured, key):
            raise OptionError(
                f"resilience.run(elastic=...): {key} is decided by the supervisor; give it to sres run "
                f"(--{key.removesuffix('_s').replace('_', '-')}) or its --elastic-config file"
            )
    return merged


def signal_name(text: str) -> str:
    """``usr2``, ``SIGUSR2`` -> ``SIGUSR2``: how users spell a signal, as the signal module names it."""
    return "SIG" + text.upper().removeprefix("SIG")


def reclaim_environ(name: str) -> dict[str, str]:
    """The variable a placement adds for ranks on a node Slurm may take back."""
    return {_VARS["reclaim_signal"]: name}


def node_name_environ(name: str) -> dict[str, str]:
    """The variable a placement adds when it knows the node's Slurm name."""
    return {_VARS["node_name"]: name}


def check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise OptionError(
            f"resilience.run(): unknown option {unknown[0]!r} (known: {', '.join(RUN_OPTIONS)})"
        )


def _parse(env: Mapping[str, str]) -> dict[str, Any]:
    v = _VARS
    return dict(
        store_host=env.get(v["store_host"], "127.0.0.1"),
        store_port=int(env[v["store_port"]]),
        store_nonce=env.get(v["store_nonce"], ""),
        slot=env[v["slot"]],
        node=int(env.get(v["node"], "0")),
        local_rank=int(env.get(v["local_rank"], "0")),
        node_name=env.get(v["node_name"], ""),
        backend=env.get(v["backend"], BACKEND),
        injections=parse_env(env.get(v["injections"])),
        heartbeat_s=float(env.get(v["heartbeat_s"], HEARTBEAT_S)),
        lease_s=float(env.get(v["lease_s"], "0")),
        reform_timeout_s=float(env.get(v["reform_timeout_s"], REFORM_TIMEOUT_S)),
        replication_factor=int(env.get(v["replication_factor"], REPLICATION_FACTOR)),
        copy_pace=float(env.get(v["copy_pace"], COPY_PACE)),
        liveness_port=int(env.get(v["liveness_port"], "0")),
        run_secret=env.get(v["run_secret"], ""),
        preempt_signal=env.get(v["preempt_signal"], PREEMPT_SIGNAL),
        log_dir=env.get(v["log_dir"], ""),
        reclaim_signal=env.get(v["reclaim_signal"], ""),
        step_id=env.get("SLURM_STEP_ID", ""),
        tiers=TierConfig.from_environ(env),
        elastic=ElasticConfig.from_json(env[ELASTIC_ENV]) if env.get(ELASTIC_ENV) else None,
    )
