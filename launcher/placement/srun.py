"""Ranks as ``srun`` steps of the job the supervisor runs in.

One step per rank process (``--overlap``: steps share the job's nodes and a respawned rank
needs no free resources), started from the batch host. The backend answers the
supervisor's questions about nodes from Slurm itself, asked again at every fault: whether a
node's slurmd still answers, which healthy nodes the job holds that no rank uses, and, when
none is left, one more node through job expansion. Node names, the store address and rank
placement never come from the stale ``SLURM_JOB_NODELIST``.

Nodes beyond the job's own come from satellites (:mod:`launcher.slurm.satellites`, the default)
or, where the cluster permits it, job expansion (``--grow-by expansion``). A satellite's
ranks are told that SIGTERM means "Slurm takes this node back" (preemption with a grace
time signals steps first): they report it and the world shrinks at a step boundary.
A node that must go is drained and dropped from the job (a satellite's: drained, and the
satellite cancelled). With ``--all-satellites`` every node that holds ranks is a satellite and
the job's own node runs only the supervisor and its store, so losing a training node never loses
them (``sbatch_templates/train_supervisor_apart.sbatch``).
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from launcher.errors import ConfigError, ShrinkRefused, SlurmError, SresError
from launcher.placement import NewNode, NodeEvidence
from launcher.placement.processes import Processes
from launcher.placement.slurmd_probe import ANSWERS, SILENT, NodeProbe, slurmd_reach
from launcher.slurm import discovery as node_discovery
from launcher.slurm.injected_drains import InjectedDrains
from launcher.slurm.satellites import GROW_BY, Satellites
from launcher.slurm.client import SlurmClient
from resilience.contract.liveness import LivenessServer
from resilience.contract.rank_env import node_name_environ, reclaim_environ

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobHosts:
    """The job's healthy nodes in the order ranks use them: the supervisor's node first."""

    job_id: str
    hosts: tuple[str, ...]
    store_host: str
    batch_job: bool
    here: str = ""
    """The node the supervisor runs on."""
    slurmd_at: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """node -> its slurmd's (address, port), as Slurm said at the start: probed also when
    slurmctld no longer answers (the supervisor's own link cut)."""


def place(client: SlurmClient, env: Mapping[str, str], needed: int) -> JobHosts:
    """Ask Slurm which nodes the job holds now and order them for ranks."""
    alloc = node_discovery.discover(client, env=env)
    job = client.job(alloc.job_id)
    here = env.get("SLURMD_NODENAME") or job.batch_host or socket.gethostname()
    hosts = sorted(alloc.healthy, key=lambda n: (n != here,))
    if len(hosts) < needed:
        bad = "; ".join(f"{n}: {why}" for n, why in alloc.unhealthy.items())
        raise ConfigError(
            f"job {alloc.job_id} has {len(hosts)} healthy node(s), {needed} needed (nodes + spares)"
            + (f"; unhealthy: {bad}" if bad else "")
        )
    store_host = alloc.addresses.get(here) or here
    slurmd_at = {n: (alloc.addresses[n], alloc.ports[n]) for n in alloc.nodes if alloc.ports.get(n)}
    batch = job.extra.get("BatchFlag", "1") != "0"
    return JobHosts(alloc.job_id, tuple(hosts), store_host, batch, here, slurmd_at)


class SrunPlacement:
    """Starts each rank with ``srun`` on a named node; watches, kills and replaces through Slurm.

    Its processes (the ``srun`` commands, their logs, the echo) are a
    :class:`~launcher.placement.processes.Processes`, as a local placement's are; what Slurm
    adds (a rank's death seen through its liveness connection, a step cancelled) wraps it.
    """

    def __init__(
        self,
        client: SlurmClient,
        placement: JobHosts,
        log_dir: Path,
        liveness: LivenessServer,
        srun_args: Sequence[str] = (),
        partition: str | None = None,
        grow: bool = True,
        probe: Callable[[str, int], str] = slurmd_reach,
        echo: TextIO | None = sys.stdout,
        grow_by: str = "satellite",
        lend_partition: str | None = None,
        lend_account: str | None = None,
        satellite_nodes: int = 0,
        satellite_timeout_s: float = 300.0,
    ) -> None:
        """``satellite_nodes``: every node that holds ranks (and spares) is a satellite, this
        many of them; the job's own node runs only the supervisor and its store."""
        self.processes, self.client = Processes(log_dir, echo), client
        self.job_id = placement.job_id
        self.hosts = list(placement.hosts)
        self._own = tuple(placement.hosts)
        self._apart = bool(satellite_nodes)
        self.store_host, self._here = placement.store_host, placement.here
        self.requeueable = placement.batch_job
        self._limit_at_start: tuple[float, float] | None = self._read_limit() if self.requeueable else None
        """(time limit, its monotonic deadline) read at start: what a requeue signal falls back on
        when slurmctld does not answer then."""
        self.liveness = liveness
        self.srun_args = tuple(srun_args)
        self.partition = partition
        self.grow_allowed = grow
        self.nodes_reach = NodeProbe(placement.slurmd_at, probe)
        self._used: set[int] = set()
        self._retired: set[int] = set()
        self._injected = InjectedDrains(self.client)
        self._shrink_refused = False
        """Slurm refused a shrink once: without slurmdbd 22.05 resizes a job once, and every
        later try blocked the supervisor's loop 5 s (mid-recovery) before failing the same way."""
        if grow_by not in GROW_BY:
            raise ConfigError(f"--grow-by {grow_by}: one of {', '.join(GROW_BY)}")
        self.grow_by = grow_by
        self.satellites = Satellites(client, self.job_id, lend_partition or partition, log_dir, lend_account)
        self.satellites.check_partition()
        self._satellite_of: dict[int, str] = {}
        """node -> the satellite job it runs in (nodes of the job itself are absent)."""
        self._node_of_slot: dict[str, int] = {}
        if satellite_nodes:
            self._start_apart(satellite_nodes, satellite_timeout_s)

    def _start_apart(self, count: int, timeout_s: float) -> None:
        got = self.satellites.acquire_many(count, exclude=list(self._own), timeout_s=timeout_s)
        if len(got) < count:
            self.satellites.release_all()
            raise ConfigError(
                f"only {len(got)} of {count} satellite node(s) started within {timeout_s:g} s in "
                f"partition {self.satellites.partition or '(default)'}"
            )
        self.hosts = [sat.node for sat in got]
        self._satellite_of = {i: sat.job_id for i, sat in enumerate(got)}

    def host(self, node: int) -> str:
        return self.hosts[node]

    def job_of(self, node: int) -> str:
        return self._satellite_of.get(node, self.job_id)

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        self._start(slot, node, command, env)

    def start_server(
        self,
        slot: str,
        node: int,
        command: Sequence[str],
        env: Mapping[str, str],
        on_reply: Callable[[str, dict[str, object]], None],
    ) -> None:
        """A fork server is a step like a rank's: srun forwards its stdin and output."""
        self.processes.on_reply = on_reply
        self._start(slot, node, command, env, feed=True)

    def _start(
        self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str], feed: bool = False
    ) -> None:
        self._node_of_slot[slot] = node
        self._used.add(node)  # a fork server's node too: its ranks are forked, never spawned here
        self.processes.start(slot, self._step(slot, node, command), self.environ(node, env), feed=feed)

    def environ(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        """A lent node's ranks act on Slurm's SIGTERM (it takes the node back); the RAM tier is
        keyed by node name, so a requeued job finds each host's copies again."""
        reclaim = reclaim_environ("TERM") if node in self._satellite_of else {}
        return {**env, **reclaim, **node_name_environ(self.hosts[node])}

    def _step(self, slot: str, node: int, command: Sequence[str]) -> list[str]:
        """The ``srun`` that runs ``command`` as ``slot``'s step on ``node``."""
        return [
            "srun",
            f"--jobid={self.job_of(node)}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={self.hosts[node]}",
            "--overlap",
            "--kill-on-bad-exit=0",
            "--quiet",
            f"--job-name=sres-{slot}",
            *self.srun_args,
            *command,
        ]

    def send(self, slot: str, data: bytes) -> bool:
        return self.processes.send(slot, data)

    def close_input(self, slot: str) -> None:
        self.processes.close_input(slot)

    def machine(self, node: int) -> str:
        return self.hosts[node]

    def rank_lost(self, slot: str) -> int | None:
        return self.liveness.lost_as(slot, killed=-signal.SIGKILL)

    def poll(self, slot: str) -> int | None:
        rc = self.processes.poll(slot)
        if rc is None:  # srun learns of a killed rank only when Slurm declares the node dead
            return self.rank_lost(slot)
        if rc > 128:
            return 128 - rc  # srun exits 128+N for a task killed by signal N: report it as Popen does
        return rc

    def kill(self, slot: str) -> None:
        peer = self.liveness.peer(slot)
        slurm_answers = self.nodes_reach.slurm_answers()  # else the process alone
        if peer is not None and peer.step_id and peer.lost_t is None and slurm_answers:
            try:
                self.client.cancel(f"{self.job_of(self._node_of_slot[slot])}.{peer.step_id}", signal="KILL")
            except SlurmError as err:
                log.info("scancel of %s's step failed: %s", slot, err)
        self.processes.kill(slot)

    def echo(self, slot: str) -> None:
        self.processes.echo_slot = slot

    def evidence(self, node: int) -> NodeEvidence:
        """Slurm's record of the node and a probe of its slurmd (:class:`NodeProbe`)."""
        name = self.hosts[node]
        own = bool(self._here) and name == self._here
        try:
            self.nodes_reach.check_slurm()
            record = self.client.node(name)
        except SlurmError as err:
            self.nodes_reach.slurm_failed(err)
            reach = self.nodes_reach.reach(name)
            return NodeEvidence(
                slurmd_answers=reach == ANSWERS,
                slurm_usable=False,
                slurm_reason=str(err),
                reachable=reach != SILENT,
                slurm_answers=False,
                runs_supervisor=own,
            )
        address = record.address or record.hostname
        reach = self.nodes_reach.reach(name, address, record.port) if record.port else ANSWERS
        return NodeEvidence(
            slurmd_answers=reach == ANSWERS,
            reachable=reach != SILENT,
            slurm_usable=record.usable,
            slurm_state=record.long_state,
            slurm_reason=record.reason,
            runs_supervisor=own,
            reclaimed=node in self._satellite_of and self.satellites.reclaimed(name),
        )

    def retire(self, node: int, why: str) -> None:
        """Drain the node (reason ``sres: why``) and drop it from the job when Slurm allows."""
        self._retired.add(node)
        name = self.hosts[node]
        self.client.drain(name, why)
        self._injected.note(name, why)
        if node in self._satellite_of:
            self.release(node, why)  # a satellite goes with its node; the job itself keeps its shape
            return
        if self._shrink_refused:
            return  # Slurm drops a dead node of a --no-kill job by itself once it declares it down
        keep = [h for i, h in enumerate(self.hosts) if i not in self._retired]
        try:
            self.client.shrink(self.job_id, [h for h in self.client.job(self.job_id).nodes if h in keep])
        except ShrinkRefused as err:
            self._shrink_refused = True
            log.info("job %s keeps %s (no more shrinks tried): %s", self.job_id, name, err)
        except SresError as err:
            log.info("job %s keeps %s for now: %s", self.job_id, name, err)

    def idle_node(self) -> NewNode | None:
        """A healthy node the job holds and no rank uses (asked from Slurm now).

        A node this job drained counts again once Slurm says it is healthy (an admin or the
        health hooks resumed it, still in the job): it comes back under a new node number, so
        nothing of its earlier life (slots, fault counts) is mistaken for the new one's.
        """
        if self._apart:
            return None  # the job's own node runs the supervisor, never ranks
        t0 = time.monotonic()
        alloc = node_discovery.discover(self.client, self.job_id)
        for name in alloc.healthy:
            live = [i for i, h in enumerate(self.hosts) if h == name and i not in self._retired]
            if not live:
                returned = name in self.hosts
                self.hosts.append(name)
                return NewNode(len(self.hosts) - 1, name, "idle", time.monotonic() - t0, returned=returned)
            if live[0] not in self._used:
                return NewNode(live[0], name, "idle", time.monotonic() - t0)
        return None

    def grow(self) -> NewNode | None:
        """One more node: a satellite job (``--grow-by satellite``) or one merged into the job
        (``expansion``); None with --no-grow or when Slurm has no idle node for it."""
        idle = (
            self.satellites.idle() if self.grow_by == "satellite" else self.client.idle_nodes(self.partition)
        )
        if not self.grow_allowed or not idle:
            return None  # nothing would start now: do not wait in the queue for it
        if self.grow_by == "satellite":
            live = {h for i, h in enumerate(self.hosts) if i not in self._retired}
            sat = self.satellites.acquire(exclude=sorted(live | set(self._own)))
            if sat is None:
                return None
            self.hosts.append(sat.node)
            self._satellite_of[len(self.hosts) - 1] = sat.job_id
            return NewNode(len(self.hosts) - 1, sat.node, "satellite", sat.seconds)
        t0 = time.monotonic()
        try:
            added = self.client.grow(self.job_id, 1, self.partition)
        except SlurmError as err:
            log.warning("job %s could not grow: %s", self.job_id, err)
            return None
        self.hosts.append(added[0])
        return NewNode(len(self.hosts) - 1, added[0], "expansion", time.monotonic() - t0)

    def simulate(self, node: int) -> NewNode | None:
        return None  # Slurm's nodes are real: they come idle in the job or from the scheduler

    def release(self, node: int, why: str) -> str | None:
        """A satellite's node leaves: its job is cancelled. A node of the job itself stays in
        the allocation (22.05 without slurmdbd shrinks a job once; it may serve as a spare)."""
        if node not in self._satellite_of:
            return None
        self._retired.add(node)
        self.satellites.release(self.hosts[node], taken_back=why == "preempted")
        return self._satellite_of[node]

    def lendable(self) -> int:
        if not self.grow_allowed or self.grow_by != "satellite":
            return 0
        try:
            return len(self.satellites.idle())
        except SlurmError as err:
            log.info("could not count idle nodes: %s", err)
            return 0

    def stop_all(self, timeout_s: float = 30.0) -> None:
        self.processes.stop_all(timeout_s)
        self.satellites.release_all()
        self._injected.undo()

    def requeue(self, why: str) -> None:
        if not self.requeueable:
            raise SresError(
                f"job {self.job_id} is an interactive allocation (salloc): Slurm cannot requeue it"
            )
        self.client.requeue(self.job_id)

    def time_limits(self) -> tuple[float | None, float | None]:
        # Asked once, when a requeue signal came: a slow or failed answer here turns a time
        # limit into a preemption (seen twice on a loaded CI machine), so a failure is retried,
        # then the limit read at start stands in (an admin's later change of it is then missed).
        for _ in range(3):
            try:
                job = self.client.job(self.job_id)
                if job.time_left_s is not None or job.time_limit_s is None:
                    return job.time_left_s, job.time_limit_s
            except SlurmError as err:
                log.warning("job %s: its time limit is unknown (%s)", self.job_id, err)
            time.sleep(0.5)
        if self._limit_at_start is not None:
            limit, deadline = self._limit_at_start
            return deadline - time.monotonic(), limit
        return None, None  # unknown: the signal counts as a preemption

    def _read_limit(self) -> tuple[float, float] | None:
        try:
            job = self.client.job(self.job_id)
        except SlurmError as err:
            log.warning("job %s: its time limit is unknown at start (%s)", self.job_id, err)
            return None
        if job.time_left_s is None or job.time_limit_s is None:
            return None  # no limit
        return job.time_limit_s, time.monotonic() + job.time_left_s
