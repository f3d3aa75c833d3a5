"""SlurmClient: every interaction of this project with Slurm goes through here.

The client holds the policy (our drain-reason prefix, never undraining an admin's drain, the job-
expansion sequence and its 22.05 quirks, reboots as ``scontrol reboot ASAP nextstate=RESUME``, a
batch host never shrunk away); a *driver* holds the mechanism. Two drivers share one typed
interface: pyslurm when it was built for the cluster's Slurm, else the command line (``sres doctor
--slurm-driver``, ``SRES_SLURM_DRIVER``; ``--backend`` and ``SRES_SLURM_BACKEND`` are their old
spellings, still read; ``SlurmClient.create("auto")`` chooses). The driver interface
(:class:`SlurmDriver`) is a handful of primitives (nodes, jobs, node states, reboot, job updates,
requeue, submit, expansion, cancel, a step); every client operation is built from them, so both
drivers share the policy and pass the same contract tests (tests/cluster/). Tests of Slurm behaviour
run against the real local cluster (tests/support/slurm_cluster.py), never against a mocked driver.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from launcher.slurm import hostlist
from launcher.errors import ConfigError, ShrinkRefused, SlurmCommandError, SlurmError
from launcher.slurm.command_driver import DEFAULT_TIMEOUT_S, CliDriver, CommandLine, Runner
from launcher.slurm.pyslurm_driver import PyslurmDriver, pyslurm_version, slurm_major_minor
from launcher.slurm.types import REASON_PREFIX, Job, JobOwner, Node

log = logging.getLogger(__name__)

__all__ = ["SlurmClient", "SlurmDriver", "Node", "Job", "REASON_PREFIX", "DriverChoice"]


class SlurmDriver(Protocol):
    """What a driver must do; the client builds every operation from these."""

    name: str

    def version(self) -> str: ...
    def ping(self) -> str: ...
    def nodes(self) -> list[Node]: ...
    def job(self, job_id: str) -> Job: ...
    def job_owner(self, job_id: str) -> JobOwner: ...
    def set_node_state(self, nodes: Sequence[str], state: str, reason: str | None = None) -> None: ...
    def reboot(self, nodes: Sequence[str], reason: str) -> None: ...
    def update_job(self, job_id: str, **fields: str) -> None: ...
    def requeue(self, job_id: str, hold: bool = False) -> None: ...
    def submit(self, sbatch_args: Sequence[str]) -> str: ...
    def allocate_expansion(
        self, job_id: str, count: int, partition: str | None, exclude: Sequence[str], timeout_s: float
    ) -> str: ...
    def cancel(self, job_id: str, signal: str | None = None) -> None: ...
    def jobs(self) -> list[Job]: ...
    def run_step(self, job_id: str, node: str, argv: Sequence[str], timeout_s: float) -> str: ...
    def config(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class DriverChoice:
    """Which driver was picked and why: ``sres doctor`` prints this."""

    name: str
    why: str


class SlurmClient:
    """Typed, policy-carrying access to Slurm. Build one with :meth:`create`."""

    def __init__(self, driver: SlurmDriver, choice: DriverChoice | None = None) -> None:
        self.driver = driver
        self.choice = choice or DriverChoice(driver.name, "given")

    @classmethod
    def create(
        cls,
        backend: str = "auto",
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        runner: Runner | None = None,
    ) -> "SlurmClient":
        """Pick a driver: ``"auto"`` (pyslurm if it matches the cluster, else the command
        line), ``"cli"`` or ``"pyslurm"`` (an error if it cannot be used)."""
        if backend not in ("auto", "cli", "pyslurm"):
            raise ConfigError(f"unknown Slurm backend {backend!r}: use auto, cli or pyslurm")
        if timeout_s <= 0:
            raise ConfigError("the Slurm command timeout must be positive")
        command = CommandLine(timeout_s=timeout_s, env=env, **({"runner": runner} if runner else {}))
        cli = CliDriver(command)
        if backend == "cli":
            return cls(cli, DriverChoice("cli", "asked for"))
        module, why = _matching_pyslurm(cli)
        if module is not None:
            return cls(PyslurmDriver(module, cli), DriverChoice("pyslurm", why))
        if backend == "pyslurm":
            raise ConfigError(f"the pyslurm backend cannot be used: {why}")
        return cls(cli, DriverChoice("cli", why))

    # --- reading -----------------------------------------------------------------------

    def version(self) -> str:
        return self.driver.version()

    def ping(self) -> str:
        """Raises if the controller does not answer."""
        return self.driver.ping()

    def nodes(self, partition: str | None = None, names: Iterable[str] | None = None) -> list[Node]:
        wanted = set(names) if names is not None else None
        return [
            n
            for n in self.driver.nodes()
            if (partition is None or partition in n.partitions) and (wanted is None or n.name in wanted)
        ]

    def node(self, name: str) -> Node:
        for node in self.nodes(names=[name]):
            return node
        raise SlurmError(f"Slurm knows no node {name}")

    def job(self, job_id: str | int) -> Job:
        return self.driver.job(str(job_id))

    def job_owner(self, job_id: str | int) -> JobOwner:
        """The job's user and Comment, from typed records (never parsed text): for decisions
        about who may control a job."""
        return self.driver.job_owner(str(job_id))

    def config(self) -> dict[str, str]:
        """slurmctld's running configuration (``scontrol show config``), key -> value."""
        return self.driver.config()

    def growth_methods(self) -> tuple[bool, str]:
        """Whether job expansion is permitted here (``SchedulerParameters=permit_job_expansion``,
        off by default since 19.05), and the preemption type (lent nodes taken back or not)."""
        config = self.config()
        return (
            "permit_job_expansion" in config.get("SchedulerParameters", "").split(","),
            config.get("PreemptType", "preempt/none"),
        )

    def jobs_named(self, name: str) -> list[Job]:
        """Jobs of that name Slurm still lists and that have not ended."""
        return [j for j in self.driver.jobs() if j.name == name and not j.finished]

    def partitions(self) -> set[str]:
        """The partitions that hold at least one node."""
        return {p for n in self.driver.nodes() for p in n.partitions}

    def idle_nodes(self, partition: str | None = None) -> list[str]:
        """Nodes that could take a new allocation now: idle, responding, not drained."""
        return [n.name for n in self.nodes(partition) if n.idle]

    # --- node state --------------------------------------------------------------------

    def drain(self, nodes: str | Iterable[str], why: str) -> None:
        """Drain with reason ``sres: <why>``, so that we (and admins) can tell our drains apart."""
        names = _names(nodes)
        reason = _our_reason(why, "drain")
        self.driver.set_node_state(names, "DRAIN", reason)
        log.info("drained %s: %s", hostlist.compress(names), reason)

    def reboot(self, nodes: str | Iterable[str], why: str) -> None:
        """Reboot once idle (``scontrol reboot ASAP nextstate=RESUME``) with reason ``sres: <why>``.

        Slurm drains the node at once (``DRAIN+REBOOT_REQUESTED``, our reason), reboots it
        when its jobs end and returns it to service after the boot. The cluster needs a
        ``RebootProgram``; without one Slurm refuses ("RebootProgram isn't defined").
        """
        names = _names(nodes)
        reason = _our_reason(why, "reboot")
        self.driver.reboot(names, reason)
        log.info("reboot requested for %s: %s", hostlist.compress(names), reason)

    def resume(self, nodes: str | Iterable[str]) -> list[str]:
        """Resume the given nodes that we drained; return those resumed.

        A node drained for another reason (an admin's, Slurm's own) is left as it is: we
        never undo a drain that is not ours.
        """
        names = _names(nodes)
        ours = [n.name for n in self.nodes(names=names) if n.drained_by_us]
        skipped = sorted(set(names) - set(ours))
        if skipped:
            log.info("not resuming %s: not drained by sres", hostlist.compress(skipped))
        if ours:
            self.driver.set_node_state(ours, "RESUME")
        return ours

    # --- jobs --------------------------------------------------------------------------

    def submit(self, sbatch_args: Sequence[str]) -> str:
        """``sbatch --parsable ARGS``; returns the job id."""
        return self.driver.submit(sbatch_args)

    def cancel(self, job_id: str | int, signal: str | None = None) -> None:
        self.driver.cancel(str(job_id), signal)

    def set_comment(self, job_id: str | int, text: str) -> None:
        self.driver.update_job(str(job_id), Comment=text)

    def run_step(self, job_id: str | int, node: str, argv: Sequence[str], timeout_s: float = 60.0) -> str:
        """Run a command as a step of a running job on one of its nodes (``srun --overlap``);
        its standard output. Slurm lets only the job's user (or root) do it."""
        return self.driver.run_step(str(job_id), node, argv, timeout_s)

    def requeue(self, job_id: str | int, hold: bool = False) -> None:
        """Requeue a job or one array task (``"123_4"``). A task named by its own numeric id
        (its ``SLURM_JOB_ID``) is requeued as ``<array>_<task>``: when that id is also the
        array's, ``scontrol requeue`` would requeue every task of the array."""
        job_id = str(job_id)
        if job_id.isdigit():
            job = self.driver.job(job_id)
            if job.array_job_id and job.array_task_id:
                job_id = f"{job.array_job_id}_{job.array_task_id}"
        self.driver.requeue(job_id, hold)

    def shrink(self, job_id: str | int, keep: Iterable[str]) -> Job:
        """Drop every node of a running job except ``keep``; return the job as it is after.

        Slurm never removes a batch job's batch host when resizing (the batch script runs
        there), so losing that node needs a job-level restart, not a shrink. Without an
        accounting database (slurmdbd), 22.05 accepts one ``NodeList`` shrink per job: a second
        one waits 5 s for a DB index that never comes and fails. Expansion merges still work.
        """
        job_id = str(job_id)
        keep = _names(keep)
        job = self.job(job_id)
        outside = sorted(set(keep) - set(job.nodes))
        if outside:
            raise ConfigError(f"cannot shrink job {job_id} to {hostlist.compress(outside)}: not in its nodes")
        if job.batch_host and job.batch_host in job.nodes and job.batch_host not in keep:
            raise SlurmError(
                f"cannot shrink job {job_id} without its batch host {job.batch_host}: Slurm never removes it"
            )
        try:
            self.driver.update_job(job_id, NodeList=hostlist.compress(keep))
        except SlurmCommandError as err:
            if self.job(job_id).nodes != job.nodes:
                raise
            raise ShrinkRefused(
                f"Slurm refused to shrink job {job_id} "
                f"({err.stderr.splitlines()[-1] if err.stderr else err}); "
                "without slurmdbd, Slurm 22.05 resizes a job's node list only once"
            ) from err
        after = self.job(job_id)
        if set(after.nodes) != set(keep):
            raise SlurmError(
                f"job {job_id} has nodes {hostlist.compress(after.nodes)} after shrinking to "
                f"{hostlist.compress(keep)}"
            )
        return after

    def grow(
        self, job_id: str | int, count: int = 1, partition: str | None = None, timeout_s: float = 60.0
    ) -> list[str]:
        """Add ``count`` idle nodes to a running job through Slurm job expansion.

        The sequence (see ../shared/slurm-testbed.md): allocate an expansion job with
        ``--dependency=expand:J``, give its nodes up (``NumNodes=0``), merge them into J
        (``NumNodes=ALL``). On 22.05 the first update already moves the nodes to J, and the
        merge then spends 5 s failing with "DB index is being set" where no accounting
        database runs; so the merge is sent only when the nodes have not moved yet, and the
        result is judged from the job's node list, not from exit codes.
        """
        job_id = str(job_id)
        if count < 1:
            raise ConfigError("grow needs a count of at least 1")
        before = self.job(job_id)
        if not before.running:
            raise SlurmError(f"job {job_id} is {before.state}: only a running job can grow")
        expansion = self.driver.allocate_expansion(
            job_id, count, partition or before.partition or None, before.nodes, timeout_s
        )

        def added() -> list[str]:
            return [n for n in self.job(job_id).nodes if n not in before.nodes]

        try:
            self.driver.update_job(expansion, NumNodes="0")
            if len(added()) < count:
                try:
                    self.driver.update_job(job_id, NumNodes="ALL")
                except SlurmCommandError as err:
                    log.debug("merge into job %s reported %s; checking its node list", job_id, err)
        finally:
            _cancel_quietly(self.driver, expansion)
        new_nodes = added()
        if len(new_nodes) < count:
            raise SlurmError(f"job {job_id} gained {len(new_nodes)} of {count} node(s) through expansion")
        log.info("job %s grew by %s", job_id, hostlist.compress(new_nodes))
        return new_nodes


def _names(nodes: str | Iterable[str]) -> list[str]:
    names = hostlist.expand(nodes) if isinstance(nodes, str) else [n for n in nodes]
    if not names:
        raise ConfigError("no nodes given")
    return names


def _our_reason(why: str, action: str) -> str:
    why = why.strip()
    if not why:
        raise ConfigError(f"a {action} needs a reason")
    return why if why.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {why}"


def _cancel_quietly(driver: SlurmDriver, job_id: str) -> None:
    """The expansion job normally ends by itself once merged; make sure it holds nothing."""
    try:
        job = driver.job(job_id)
        if not job.finished:
            driver.cancel(job_id)
    except SlurmError as err:
        log.debug("expansion job %s: %s", job_id, err)


def _matching_pyslurm(cli: CliDriver) -> tuple[object | None, str]:
    """Return (pyslurm module, why) if it is usable with this cluster, else (None, why not)."""
    try:
        module = importlib.import_module("pyslurm")
    except ImportError:
        return None, "pyslurm is not installed"
    except Exception as err:  # noqa: BLE001 - a pyslurm built for another Slurm fails to load
        return None, f"pyslurm failed to load ({type(err).__name__}: {err})"
    built_for = pyslurm_version(module)
    try:
        cluster = slurm_major_minor(cli.version())
    except SlurmError as err:
        return None, f"cannot read the Slurm version ({err})"
    if built_for is None or cluster is None or built_for != cluster:
        return None, f"pyslurm targets Slurm {_fmt(built_for)}, the cluster runs {_fmt(cluster)}"
    return module, f"pyslurm targets Slurm {_fmt(built_for)}, as the cluster"


def _fmt(version: tuple[int, int] | None) -> str:
    return f"{version[0]}.{version[1]:02d}" if version else "unknown"


def driver_named(env: Mapping[str, str]) -> str:
    """The driver ``env`` asks for: ``SRES_SLURM_DRIVER``, else the old ``SRES_SLURM_BACKEND``
    (scripts and admins' hook environments set it before the rename), else ``auto``."""
    return env.get("SRES_SLURM_DRIVER") or env.get("SRES_SLURM_BACKEND") or "auto"


def default_client() -> SlurmClient:
    """The client for this process, with the driver its environment names."""
    return SlurmClient.create(driver_named(os.environ))
