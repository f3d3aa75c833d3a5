"""A real Slurm cluster on this machine: one slurmctld and several slurmd, for tests and by hand.

Every Slurm test in this project runs against this cluster, never against a mocked
``scontrol``. It follows ../shared/slurm-testbed.md: one ``NodeName`` range on a port
range, ``%n`` in per-node paths, one ``slurmd -N <name>`` per node. Three partitions span
every node: ``gpu`` (the default, never preempted), ``lend`` (low priority, preempted with a
``GraceTime``) and ``urgent`` (high priority), under ``PreemptType=preempt/partition_prio``.

``sched_interval=5``: a requeued job becomes eligible once its credential expires
(``cred_expire=10``), an event no scheduling pass follows; at the default 60 s, the periodic pass
that started it came up to a minute later (measured: a preemption-requeue test, 58 s -> 34 s).
Busy production clusters tune this too; nothing in sres depends on it.

``network=``: each slurmd in a network namespace of its own (``tests/support/netns.py``), one
``NodeName`` line a node with its own ``NodeAddr``, slurmctld on the bridge's address. Everything
Slurm starts on a node (the batch script, steps) inherits the namespace, so a link taken down cuts
the node off as a switch port does. slurmd enters with ``nsenter --net``: ``ip netns exec``
remounts /sys, and slurmd then finds no cgroup filesystem. Nothing else changes: srun reaches the
nodes, and they it, at the addresses Slurm reads off each connection.

By hand::

    python -m tests.support.slurm_cluster up [--nodes 5] [--dir /tmp/sres-cluster]
    export SLURM_CONF=/tmp/sres-cluster/slurm.conf
    sinfo; sbatch sbatch_templates/...
    python -m tests.support.slurm_cluster down [--dir /tmp/sres-cluster]

Daemons run in the foreground (``-D``) as children in their own session, so we know their
PIDs without racing on pid files, and ``down`` stops exactly the PIDs recorded in
``cluster.json``: nothing else on the machine is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.run.leftovers import pid_alive, processes_with_env  # noqa: F401 - tests import them from here
from tests.support.accounting import AccountingDaemons, AccountingUnavailable
from tests.support.ports import free_range

if TYPE_CHECKING:
    from tests.support.netns import Network

NEEDED_COMMANDS = ("slurmctld", "slurmd", "munged", "sinfo", "scontrol", "srun", "sbatch", "salloc")
STATE_FILE = "cluster.json"
NODE_RESOURCES = "CPUs=2 RealMemory=2000 Gres=gpu:2"


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the test cluster; the message says why in one line."""


class PortTaken(Exception):
    """A daemon's port was taken between its choice and the daemon's bind (not a RuntimeError:
    the waits retry those)."""


@dataclass
class ClusterState:
    """What ``down`` needs to stop a cluster started by another process."""

    directory: str
    nodes: list[str]
    ctld_port: int
    node_ports: list[int]
    cluster_name: str
    ctld_pid: int = 0
    slurmd_pids: dict[str, int] = field(default_factory=dict)
    munged_pid: int = 0
    accounting_pids: list[int] = field(default_factory=list)


class SlurmCluster:
    """Handle on a running local cluster: its config, its nodes and ways to break them."""

    def __init__(
        self,
        directory: Path,
        node_count: int = 5,
        slurmd_timeout: int = 10,
        extra_conf: str = "",
        grace_time: int = 10,
        network: Network | None = None,
        accounting: bool = False,
    ) -> None:
        """``network``: each node's slurmd (and so its jobs' processes) in that network's
        namespace of the node, at its own address; slurmctld in this namespace, on the bridge.
        Made and removed by the caller, with at least ``node_count`` nodes. ``accounting``:
        slurmdbd on a MariaDB server of its own (tests/support/accounting.py), one partition
        ``gpu``, and no preemption settings: the caller's ``extra_conf`` gives them (a
        governance policy's lines)."""
        if node_count < 1:
            raise ValueError("node_count must be at least 1")
        self.directory = Path(directory).resolve()
        self.nodes = [f"n{i}" for i in range(1, node_count + 1)]
        self.slurmd_timeout = slurmd_timeout
        self.extra_conf = extra_conf
        self.grace_time = grace_time
        self.network = network
        if network is not None and network.nodes < node_count:
            raise ValueError(f"a network of {network.nodes} nodes for {node_count} slurmd")
        self.hostname = socket.gethostname()
        self._ctld: subprocess.Popen | None = None
        self._slurmd: dict[str, subprocess.Popen] = {}
        self._munged_pid = 0
        self.ctld_port, self.node_ports = _free_ports(node_count)
        self.cluster_name = f"sres{self.ctld_port}"
        self.accounting = AccountingDaemons(self.directory, free_range(1)[0]) if accounting else None

    # --- paths and environment -------------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def plugstack_path(self) -> Path:
        return self.directory / "plugstack.conf"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def env(self) -> dict[str, str]:
        """Environment for Slurm clients pointed at this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    # --- lifecycle ---------------------------------------------------------------------

    def up(self, timeout: float = 60.0, attempts: int = 3) -> "SlurmCluster":
        """Start every daemon and wait for every node idle; a daemon whose port was taken in the
        meantime (by a listener that named it) is started again on fresh ports."""
        for attempt in range(1, attempts + 1):
            try:
                return self._up(timeout)
            except PortTaken as err:
                self.down()
                self.log_dir.rename(self.directory / f"log-attempt-{attempt}")  # its bind error stays
                if attempt == attempts:
                    raise ClusterUnavailable(f"{err} ({attempts} times)") from None
                self.ctld_port, self.node_ports = _free_ports(len(self.nodes))
                self.cluster_name = f"sres{self.ctld_port}"
        raise AssertionError("unreachable")

    def _up(self, timeout: float) -> "SlurmCluster":
        check_machine()
        # Started with -i (ignore saved state): a previous cluster's state in the same
        # directory would only make slurmctld refuse to start (cluster name mismatch).
        shutil.rmtree(self.directory / "state", ignore_errors=True)
        for sub in ("state", "spool", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.directory / "spool" / node).mkdir(exist_ok=True)
        self.plugstack_path.touch()
        self.conf_path.write_text(self._slurm_conf())
        # Two "GPUs" per node for Slurm's bookkeeping, so GPU job scripts (--gpus-per-node) are
        # accepted and scheduled as on a GPU partition. Slurm drops file-less GPUs; any two
        # character devices do (nothing opens them: TaskPlugin=task/none binds no device).
        (self.directory / "gres.conf").write_text("Name=gpu File=/dev/null\nName=gpu File=/dev/zero\n")
        self._munged_pid = ensure_munged()
        if self.accounting is not None:
            try:
                self.accounting.up(self.env(), self.cluster_name, timeout)
            except AccountingUnavailable as err:
                raise ClusterUnavailable(str(err)) from None
        self._ctld = self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf_path)], "slurmctld")
        self._save_state()
        self._wait(
            lambda: self._run(["scontrol", "ping"], check=False).returncode == 0,
            timeout,
            "slurmctld did not answer 'scontrol ping'",
        )
        for node in self.nodes:
            self.start_node(node)
        for node in self.nodes:
            self.wait_state(node, lambda s, node=node: self._slurmd_running(node) and s == "IDLE", timeout)
        return self

    def _slurmd_running(self, node: str) -> bool:
        """True while ``node``'s slurmd runs; :class:`PortTaken` once it exited unable to bind."""
        proc = self._slurmd[node]
        if proc.poll() is None:
            return True
        log = self.log_dir / f"slurmd-{node}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        if any("Address already in use" in line for line in lines):
            raise PortTaken(f"slurmd of {node} could not bind port {self.node_ports[self.nodes.index(node)]}")
        return False

    def down(self) -> None:
        """Stop every daemon this cluster started, by PID, and wait for them to exit."""
        procs = list(self._slurmd.values()) + ([self._ctld] if self._ctld else [])
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._slurmd.clear()
        self._ctld = None
        if self.accounting is not None:
            self.accounting.down()
        if self._munged_pid:
            _stop_pid(self._munged_pid)
            self._munged_pid = 0
        state = self.directory / STATE_FILE
        if state.exists():
            state.unlink()

    def __enter__(self) -> "SlurmCluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def daemon_pids(self) -> list[int]:
        """PIDs of the daemons this handle started and that still run."""
        procs = list(self._slurmd.values()) + ([self._ctld] if self._ctld else [])
        return [p.pid for p in procs if p.poll() is None]

    # --- node faults -------------------------------------------------------------------

    def start_node(self, node: str) -> None:
        proc = self._slurmd.get(node)
        if proc is not None and proc.poll() is None:
            return
        argv = ["slurmd", "-D", "-N", node, "-f", str(self.conf_path)]
        if self.network is not None:
            namespace = self.network.namespace(self.nodes.index(node))
            argv = ["nsenter", f"--net=/run/netns/{namespace}", *argv]  # not ip netns exec: it remounts /sys
        self._slurmd[node] = self._spawn(argv, f"slurmd-{node}-stdout")
        self._save_state()

    def kill_node(self, node: str) -> list[int]:
        """Make ``node`` die for real: SIGKILL its slurmd and every process that belongs to it.

        All nodes share one host, so killing slurmd alone would leave the tasks "on" the
        node running; a task carries ``SLURMD_NODENAME=<node>`` in its environment, and its
        slurmstepd is found through its parent chain. Returns the PIDs killed.
        """
        proc = self._slurmd.pop(node, None)
        victims: list[int] = []
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
            victims.append(proc.pid)
        for pid in node_processes(node):
            try:
                os.kill(pid, signal.SIGKILL)
                victims.append(pid)
            except ProcessLookupError:
                pass
        _wait_dead(victims, timeout=10.0)
        self._save_state()
        return victims

    def restart_node(self, node: str, timeout: float = 60.0) -> None:
        """Bring a killed node back; with ReturnToService=2 Slurm returns it to service."""
        self.start_node(node)
        self.wait_state(node, lambda s: "DOWN" not in s and "NOT_RESPONDING" not in s, timeout)

    # --- admin actions, done as an admin would (scontrol), not through our client ----

    def drain(self, node: str, reason: str) -> None:
        self._run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume(self, node: str) -> None:
        self._run(["scontrol", "update", f"nodename={node}", "state=resume"])

    def reset(self, timeout: float = 60.0) -> None:
        """Return to a clean cluster between tests: no jobs (whoever's: tests/security submits
        as other users), every node up and idle."""
        jobs = self._run(["squeue", "-h", "-o", "%i"]).stdout.split()
        if jobs:
            self._run(["scancel", "--full", "--quiet", *jobs], check=False)
        for node in self.nodes:
            if node not in self._slurmd or self._slurmd[node].poll() is not None:
                self.start_node(node)
        try:
            self._wait(self._queue_empty, timeout / 2, "jobs did not leave the queue after scancel")
        except TimeoutError:
            self._force_out_stuck_jobs()
            self._wait(self._queue_empty, timeout, self._stuck_jobs)
        for node, state in self.node_states().items():
            if "DRAIN" in state or "DOWN" in state or "FAIL" in state:
                self._run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        self.wait_idle(self.nodes, timeout)

    def _queue_empty(self) -> bool:
        return not self._run(["squeue", "-h", "-o", "%i"]).stdout.strip()

    def _stuck_jobs(self) -> str:
        listed = self._run(["squeue", "-h", "-o", "%i %T %N %r"], check=False).stdout.strip()
        return f"jobs did not leave the queue after scancel and their nodes set down: {listed!r}"

    def _force_out_stuck_jobs(self) -> None:
        """A job left completing (an epilog a loaded machine has not finished, a node between
        a cancelled reboot and its next registration) leaves the queue when its nodes go down:
        what an admin does, and the nodes come back below with the others."""
        nodes = self._run(["squeue", "-h", "-o", "%N"], check=False).stdout.split()
        for hostlist in set(nodes):
            self._run(
                ["scontrol", "update", f"nodename={hostlist}", "state=down", "reason=test-reset"],
                check=False,
            )
        jobs = self._run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if jobs:
            self._run(["scancel", "--full", "--quiet", *jobs], check=False)

    # --- observation -------------------------------------------------------------------

    def queue(self) -> list[str]:
        """Every job and job step Slurm still lists (``squeue`` and ``squeue --steps``)."""
        jobs = self._run(["squeue", "-h", "-o", "%i %T"]).stdout.splitlines()
        steps = self._run(["squeue", "-h", "--steps", "-o", "%i %j"]).stdout.splitlines()
        return [line for line in jobs + steps if line.strip()]

    def node_states(self) -> dict[str, str]:
        """Node name -> Slurm's long state, e.g. ``IDLE``, ``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``."""
        out = self._run(["scontrol", "-o", "show", "node"]).stdout
        return {_field(line, "NodeName"): _field(line, "State") for line in out.splitlines() if line}

    def _scontrol_state(self, node: str) -> str:
        return _field(self._run(["scontrol", "-o", "show", "node", node]).stdout, "State")

    def wait_idle(self, nodes: list[str], timeout: float = 60.0) -> None:
        for node in nodes:
            self.wait_state(node, lambda s: s == "IDLE", timeout)

    def wait_state(self, node: str, predicate, timeout: float) -> str:
        last = ""

        def ready() -> bool:
            nonlocal last
            last = self._scontrol_state(node)
            return bool(predicate(last))

        self._wait(ready, timeout, lambda: f"node {node} stayed in state {last}")
        return last

    # --- internals ---------------------------------------------------------------------

    def _slurm_conf(self) -> str:
        first, last = self.node_ports[0], self.node_ports[-1]
        node_range = f"n[1-{len(self.nodes)}]" if len(self.nodes) > 1 else "n1"
        lend_preemption = f"PreemptMode=CANCEL GraceTime={self.grace_time}"
        partitions = f"""\
PartitionName=gpu Nodes={node_range} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=lend Nodes={node_range} MaxTime=INFINITE State=UP PriorityTier=1 {lend_preemption}
PartitionName=urgent Nodes={node_range} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"""
        accounting = "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none"
        preemption = "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL"
        if self.accounting is not None:
            accounting, preemption = self.accounting.conf_lines(), ""
            partitions = f"PartitionName=gpu Nodes={node_range} Default=YES MaxTime=INFINITE State=UP"
        port = f"{first}-{last}" if len(self.nodes) > 1 else str(first)
        ctld_address = "127.0.0.1" if self.network is None else self.network.host
        host = f"NodeHostname={self.hostname}"
        nodes = f"NodeName={node_range} {host} NodeAddr=127.0.0.1 Port={port} {NODE_RESOURCES}"
        if self.network is not None:  # one line a node: an address of its own
            nodes = "\n".join(
                f"NodeName={name} {host} NodeAddr={self.network.address(i)} "
                f"Port={self.node_ports[i]} {NODE_RESOURCES}"
                for i, name in enumerate(self.nodes)
            )
        d = self.directory
        return f"""\
# Written by tests/support/slurm_cluster.py: a {len(self.nodes)}-node cluster on one host.
ClusterName={self.cluster_name}
SlurmctldHost={self.hostname}({ctld_address})
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
PlugStackConfig={self.plugstack_path}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=permit_job_expansion,sched_interval=5
{accounting}
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout={self.slurmd_timeout}
SlurmctldTimeout=30
MessageTimeout=5
KillWait=5
MinJobAge=300
InactiveLimit=0
GresTypes=gpu
{preemption}
{self.extra_conf}
{nodes}
{partitions}
"""

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{log_name}.out", "ab")
        try:
            return subprocess.Popen(
                argv,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def _wait(self, ready, timeout: float, what) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                message = what() if callable(what) else what
                raise TimeoutError(f"{message} after {timeout:.0f} s (logs: {self.log_dir})")
            if self._ctld is not None and self._ctld.poll() is not None:
                raise ClusterUnavailable(
                    f"slurmctld exited with {self._ctld.returncode}; see {self.log_dir}/slurmctld.log"
                )
            time.sleep(0.25)

    def _save_state(self) -> None:
        state = ClusterState(
            directory=str(self.directory),
            nodes=self.nodes,
            ctld_port=self.ctld_port,
            node_ports=self.node_ports,
            cluster_name=self.cluster_name,
            ctld_pid=self._ctld.pid if self._ctld else 0,
            slurmd_pids={n: p.pid for n, p in self._slurmd.items() if p.poll() is None},
            munged_pid=self._munged_pid,
            accounting_pids=self.accounting.pids() if self.accounting is not None else [],
        )
        (self.directory / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))


def _field(record: str, key: str) -> str:
    for token in record.split():
        if token.startswith(key + "="):
            return token[len(key) + 1 :]
    return ""


def check_machine() -> None:
    """Raise ClusterUnavailable with one line if this machine cannot run the cluster."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the Slurm test cluster needs root (slurmd runs jobs as any user)")
    missing = [c for c in NEEDED_COMMANDS if shutil.which(c) is None]
    if missing:
        raise ClusterUnavailable(
            f"Slurm is not installed (missing {', '.join(missing)}): run ./tests/run.sh, which installs "
            "slurm-wlm, slurm-client and munge"
        )


def ensure_munged(timeout: float = 10.0) -> int:
    """Start munged if no daemon answers; return its PID if we started it, else 0."""
    if _munge_works():
        return 0
    if not Path("/etc/munge/munge.key").exists():
        raise ClusterUnavailable("/etc/munge/munge.key is missing: reinstall the munge package")
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True, timeout=30)
    deadline = time.monotonic() + timeout
    while not _munge_works():
        if time.monotonic() > deadline:
            raise ClusterUnavailable("munged did not start: see /var/log/munge/munged.log")
        time.sleep(0.1)
    pid_file = run_dir / "munged.pid"
    return int(pid_file.read_text().strip()) if pid_file.exists() else 0


def _munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if cred.returncode != 0:
            return False
        check = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=5)
        return check.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def node_processes(node: str) -> list[int]:
    """PIDs of processes that run "on" ``node``: tasks with SLURMD_NODENAME=node, their
    slurmstepd parents, and slurmstepd processes whose command line names the node."""
    marker = f"SLURMD_NODENAME={node}".encode()
    pids: set[int] = set()
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        if marker in environ.split(b"\0"):
            pids.add(pid)
        elif b"slurmstepd" in cmdline and node.encode() in cmdline.split(b"\0"):
            pids.add(pid)
    for pid in list(pids):
        parent = parents.get(pid, 0)
        while parent > 1:
            try:
                comm = Path(f"/proc/{parent}/comm").read_text().strip()
            except OSError:
                break
            if comm != "slurmstepd":
                break
            pids.add(parent)
            parent = parents.get(parent, 0)
    pids.discard(os.getpid())
    return sorted(pids)


def _wait_dead(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            alive = [p for p in pids if pid_alive(p)]
            raise TimeoutError(f"processes {alive} survived SIGKILL for {timeout:.0f} s")
        time.sleep(0.05)


def _free_ports(node_count: int) -> tuple[int, list[int]]:
    """A free controller port and a contiguous free range for the slurmd, chosen at random
    so that two test runs on one machine do not collide, below the ephemeral range
    (tests/support/ports.py says why)."""
    try:
        ports = free_range(node_count + 1)
    except RuntimeError as err:
        raise ClusterUnavailable(str(err)) from None
    return ports[0], ports[1:]


def _stop_pid(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_recorded(directory: Path) -> list[int]:
    """Stop the daemons recorded in ``directory/cluster.json``; return the PIDs stopped."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        raise ClusterUnavailable(f"no cluster recorded in {directory} (missing {STATE_FILE})")
    state = ClusterState(**json.loads(path.read_text()))
    pids = list(state.slurmd_pids.values()) + [state.ctld_pid]
    pids += [state.munged_pid] if state.munged_pid else []
    pids += state.accounting_pids
    for pid in pids:
        if pid:
            _stop_pid(pid)
    path.unlink()
    return pids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.slurm_cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", default="/tmp/sres-cluster", help="where config, state and logs live")
    parser.add_argument("--nodes", type=int, default=5, help="number of nodes (default 5)")
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    try:
        if args.action == "down":
            pids = stop_recorded(directory)
            print(f"stopped {len(pids)} daemons ({' '.join(map(str, pids))})")
            return 0
        if (directory / STATE_FILE).exists():
            print(f"error: a cluster is already recorded in {directory}; run 'down' first", file=sys.stderr)
            return 1
        cluster = SlurmCluster(directory, node_count=args.nodes)
        try:
            cluster.up()
        except BaseException:
            cluster.down()
            raise
        print(f"{len(cluster.nodes)} nodes idle in partition 'gpu' (logs: {cluster.log_dir})")
        print(f"export SLURM_CONF={cluster.conf_path}")
        return 0
    except (ClusterUnavailable, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def iter_cluster(directory: Path, **kwargs) -> Iterator[SlurmCluster]:
    """Start a cluster, yield it, always stop it: the body of the pytest fixture."""
    cluster = SlurmCluster(directory, **kwargs)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())


def wait_processes_gone(log_dir: Path, timeout: float = 60.0) -> None:
    """Until no process of the run logging to ``log_dir`` is alive (a cancelled run's ranks too)."""
    deadline = time.monotonic() + timeout
    while left := [p for p in processes_with_env(f"SRES_LOG_DIR={Path(log_dir).resolve()}") if pid_alive(p)]:
        assert time.monotonic() < deadline, f"still running after {timeout:.0f} s: {left}"
        time.sleep(0.3)
