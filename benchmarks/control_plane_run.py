"""One run of the control-plane harness: the real supervisor over rank stubs, a node fault, the
figures (``benchmarks/control_plane.py`` prints them; its docstring says what each one is)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist

from launcher.observability.events import read_events
from launcher.observability.straggler import StragglerConfig
from launcher.placement import NewNode, NodeEvidence
from launcher.supervisor.config import RunConfig
from launcher.supervisor.loop import Supervisor

STUBS = Path(__file__).resolve().parent / "control_plane_stubs.py"
REQUESTS = itertools.count()
"""Store requests this process made (every ``TCPStore`` call: the supervisor's and the server's
own clients); the stub hosts count theirs the same way."""


def count_store_requests() -> None:
    """Count every call of a ``TCPStore`` client, whatever code calls it (ours, torch's, an older
    tree's): each is one request to the server."""
    cls = dist.TCPStore
    for name in ("get", "set", "add", "check", "wait", "compare_set", "delete_key", "multi_get", "multi_set"):
        method = getattr(cls, name)

        def counted(self: Any, *args: Any, _method: Any = method, **kw: Any) -> Any:
            next(REQUESTS)
            return _method(self, *args, **kw)

        setattr(cls, name, counted)


def requests_so_far() -> int:
    return next(REQUESTS)  # the call itself adds one; negligible next to thousands


@dataclass(frozen=True)
class Shape:
    ranks: int
    procs_per_node: int = 8
    hosts: int = 0
    steady_s: float = 4.0
    heartbeat_s: float = 0.5
    fault: str = "node"
    """``node``: the last node is lost (its ranks stop, their connections close); ``hang``: one rank
    of it stops beating (the supervisor kills it after ``hang_timeout_s`` and respawns it);
    ``slow``: its steps take ``slow_factor`` times longer (a straggler: the run replaces it, as
    ``--straggler-action replace`` does, after 5 slow steps)."""
    hang_timeout_s: float = 60.0
    slow_factor: float = 3.0
    """Hundreds of stubs share a process and its GIL here: a burst of work (a recovery) can hold a
    stub's heartbeat back for seconds, which a real rank never sees; a hang fault sets its own."""

    @property
    def nodes(self) -> int:
        return max(2, -(-self.ranks // self.procs_per_node))

    @property
    def host_count(self) -> int:
        return self.hosts or min(16, max(2, self.ranks // 256))


class StubHost:
    """One stub process: orders in through its stdin, exits and records out of its stdout."""

    def __init__(self, index: int, on_line: Any) -> None:
        env = {**os.environ, "SRES_STUB_COUNT": "1", "PYTHONPATH": os.pathsep.join(sys.path[:2])}
        self.proc = subprocess.Popen(
            [sys.executable, str(STUBS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, args=(on_line,), daemon=True)
        self._reader.start()

    def send(self, order: Mapping[str, Any]) -> None:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        with self._lock:
            try:
                stdin.write(json.dumps(order) + "\n")
                stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def _read(self, on_line: Any) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            on_line(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class StubPlacement:
    """Every node a set of stub ranks in one of the hosts; a lost liveness connection is the
    rank's death, as under srun (the process's exit may never be seen)."""

    store_host = "127.0.0.1"
    job_id: str | None = None
    requeueable = False

    def __init__(self, hosts: Sequence[StubHost]) -> None:
        self.hosts = list(hosts)
        self.rc: dict[str, int | None] = {}
        self.where: dict[str, StubHost] = {}
        self.liveness: Any = None
        self.dead: set[int] = set()
        """Nodes the harness killed: their slurmd would not answer."""

    def host_of(self, node: int) -> StubHost:
        return self.hosts[node % len(self.hosts)]

    def exited(self, slot: str, rc: int) -> None:
        self.rc[slot] = rc

    def host(self, node: int) -> str:
        return f"stub{node}"

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.rc[slot] = None
        ours = {k: v for k, v in env.items() if k.startswith("SRES_")}
        self.where[slot] = self.host_of(node)
        self.where[slot].send({"op": "start", "slot": slot, "env": ours})

    def poll(self, slot: str) -> int | None:
        rc = self.rc.get(slot)
        if rc is None and self.liveness is not None:
            return self.liveness.lost_as(slot, killed=-9)  # as SrunPlacement.poll: its connection
        return rc

    def kill(self, slot: str) -> None:
        if slot in self.where:
            self.where[slot].send({"op": "kill", "slot": slot})
        if self.rc.get(slot) is None:
            self.rc[slot] = -9

    def echo(self, slot: str) -> None:
        pass

    def stop_all(self, timeout_s: float = 30.0) -> None:
        pass  # the stubs leave on the shutdown flag; the harness closes the hosts

    def evidence(self, node: int) -> NodeEvidence:
        if node in self.dead:
            return NodeEvidence(slurmd_answers=False, slurm_usable=False, slurm_state="DOWN")
        return NodeEvidence()

    def retire(self, node: int, why: str) -> None:
        pass

    def idle_node(self) -> NewNode | None:
        return None

    def grow(self) -> NewNode | None:
        return None

    def simulate(self, node: int) -> NewNode | None:
        return None

    def release(self, node: int, why: str) -> str | None:
        return None

    def lendable(self) -> int:
        return 0

    def job_of(self, node: int) -> str | None:
        return None

    def requeue(self, why: str) -> None:
        pass

    def time_limits(self) -> tuple[float | None, float | None]:
        return None, None


class Harness:
    def __init__(self, shape: Shape, log_dir: Path) -> None:
        self.shape, self.log_dir = shape, log_dir
        self.joins: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.counts: dict[int, int] = {}
        self._changed = threading.Condition()
        self.hosts = [StubHost(i, lambda rec, i=i: self._line(i, rec)) for i in range(shape.host_count)]
        self.placement = StubPlacement(self.hosts)

    def _line(self, host: int, record: dict[str, Any]) -> None:
        with self._changed:
            if "exit" in record:
                self.placement.exited(record["exit"], record["rc"])
            elif "join" in record:
                self.joins.append(record)
            elif "error" in record:
                self.errors.append(f"{record['error']}: {record['message']}")
            elif "count" in record:
                self.counts[host] = record["count"]
            self._changed.notify_all()

    def _await(self, what: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not what():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def store_requests(self) -> int:
        """Every process's store requests so far (the hosts answer a count order)."""
        with self._changed:
            self.counts.clear()
        for host in self.hosts:
            host.send({"op": "count"})
        self._await(lambda: len(self.counts) == len(self.hosts), 30)
        return sum(self.counts.values()) + requests_so_far()

    def hosts_cpu(self) -> float:
        """CPU seconds (user + system) the stub processes used so far."""
        total = 0
        for host in self.hosts:
            try:
                fields = Path(f"/proc/{host.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def joined(self, generation: int) -> int:
        return sum(1 for j in self.joins if j["generation"] == generation and j["ok"])

    def run(self) -> dict[str, Any]:
        s = self.shape
        count_store_requests()
        config = RunConfig(
            command=("stub",),
            nodes=s.nodes,
            procs_per_node=s.procs_per_node,
            spares=1,
            fork_server=False,
            heartbeat_s=s.heartbeat_s,
            hang_timeout_s=s.hang_timeout_s,
            straggler=StragglerConfig(factor=1.5, steps=5, action="replace" if s.fault == "slow" else "none"),
            startup_timeout_s=600.0,
            reform_timeout_s=300.0,
            log_dir=self.log_dir,
        )
        supervisor = Supervisor(config, self.placement, out=open(os.devnull, "w"))
        self.placement.liveness = supervisor.liveness
        measured: dict[str, Any] = {}
        driver = threading.Thread(target=self._drive, args=(supervisor, measured), daemon=True)
        started = time.monotonic()
        driver.start()
        outcome = supervisor.run()
        for host in self.hosts:
            host.close()
        driver.join(timeout=5)
        measured["run_s"] = round(time.monotonic() - started, 2)
        return self._figures(supervisor, outcome.ok, outcome.reason, measured)

    def _drive(self, supervisor: Supervisor, measured: dict[str, Any]) -> None:
        """Wait for every rank to train, measure the steady state, kill the last node."""
        s = self.shape
        world = s.nodes * s.procs_per_node
        t0 = time.monotonic()
        if not self._await(lambda: self.joined(1) >= world, 900):
            measured["problem"] = f"only {self.joined(1)} of {world} ranks joined generation 1"
            supervisor.store.plans.shut_down()
            return
        measured["start_s"] = round(time.monotonic() - t0, 2)
        progress(f"all {world} ranks train (after {measured['start_s']:.1f} s); the steady window next")
        time.sleep(1.0 + 2 * s.heartbeat_s)  # every rank past its first step reports
        cpu, requests, wall = time.process_time(), self.store_requests(), time.monotonic()
        time.sleep(s.steady_s)
        cpu, requests, wall = (
            time.process_time() - cpu,
            self.store_requests() - requests,
            time.monotonic() - wall,
        )
        measured["steady_supervisor_cpu"] = round(cpu / wall, 4)
        measured["steady_store_rps"] = round(requests / wall, 1)
        self._fault(measured, world)

    def _fault(self, measured: dict[str, Any], world: int) -> None:
        """Lose the last node (or hang one rank of it), then wait for every rank in generation 2."""
        victim = self.shape.nodes - 1
        measured["kill_t"] = time.time()
        rps = measured["steady_store_rps"]
        progress(f"steady: {rps:.0f} store requests/s; {self.shape.fault} at node {victim}")
        stubs_cpu, requests, own_cpu = self.hosts_cpu(), self.store_requests(), time.process_time()
        host = self.placement.host_of(victim)
        if self.shape.fault == "slow":
            host.send({"op": "slow", "node": victim, "factor": self.shape.slow_factor})
        elif self.shape.fault == "hang":
            host.send({"op": "hang", "slot": f"n{victim}p0"})
        else:
            self.placement.dead.add(victim)
            self.placement.host_of(victim).send({"op": "kill-node", "node": victim})
        measured["victim"] = victim
        if self._await(lambda: self.joined(2) >= world, 300):
            # The stubs' own work on the recovery path (hundreds a process, on this machine's cores):
            # where it is most of the path, the path measures the harness, not the control plane.
            measured["recovery_stubs_cpu_s"] = round(self.hosts_cpu() - stubs_cpu, 2)
            # The supervisor's process (its loop, the liveness server, the store's server thread)
            # over the same span: the control plane's own share of the path.
            measured["recovery_supervisor_cpu_s"] = round(time.process_time() - own_cpu, 2)
            # Every store request from the kill to the last release, a rank: what the path asks of
            # the one store as the run grows (the steady background in it is a few hundred).
            measured["recovery_requests_per_rank"] = round((self.store_requests() - requests) / world, 1)

    def _figures(
        self, supervisor: Supervisor, ok: bool, reason: str, measured: dict[str, Any]
    ) -> dict[str, Any]:
        s = self.shape
        out: dict[str, Any] = {"ranks": s.nodes * s.procs_per_node, "nodes": s.nodes, "hosts": s.host_count}
        out.update({k: v for k, v in measured.items() if k != "kill_t"})
        problems = [measured["problem"]] if "problem" in measured else []
        problems += self.errors[:5]
        if not ok:
            faults = read_events(self.log_dir / "events.jsonl").of("fault")
            kinds = sorted({f"{f.get('kind')} at {f.t - measured.get('kill_t', f.t):+.1f} s" for f in faults})
            kinds += [
                f"dropped: {e.get('why')}"
                for e in read_events(self.log_dir / "events.jsonl")
                if "drop" in e.name
            ][:3]
            problems.append(f"the run failed: {reason[:300]}; faults (vs the kill): {kinds[:8]}")
        if "kill_t" in measured:
            path, problems = self._path(supervisor, measured["kill_t"], problems)
            out.update(path)
        out["problems"] = problems
        out["ok"] = not problems
        return out

    def _path(
        self, supervisor: Supervisor, kill_t: float, problems: list[str]
    ) -> tuple[dict[str, Any], list[str]]:
        events = read_events(self.log_dir / "events.jsonl")
        faults = events.of("fault")
        plan = supervisor.store.plans.get(2)
        if not faults or plan is None:
            return {}, problems + ["no fault was decided, or no generation 2"]
        joins = [j for j in self.joins if j["generation"] == 2 and j["ok"]]
        problems = problems + check_protocol(self.joins, plan.members.values())
        if not joins:
            return {}, problems
        released = max(j["joined"] for j in joins)
        generation = events.of("generation")
        published = next((e.t for e in generation if e.get("generation") == 2), None)
        left = [j["released"] for j in joins if j.get("released")]
        path = {
            "detect_s": round(faults[0].t - kill_t, 4),  # a slow node: the straggler's replacement
            "notified_s": round(max(left) - kill_t, 4) if left else None,
            "published_s": round(published - kill_t, 4) if published is not None else None,
            "released_s": round(released - kill_t, 4),
            "barrier_s": round(released - max(j["arrived"] for j in joins), 4),
        }
        return path, problems


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def check_protocol(joins: Sequence[Mapping[str, Any]], members: Any) -> list[str]:
    """The stubs' records against the protocol: each slot released at most once per generation and
    in increasing generations (never in two at once), and every member of plan 2 released into it."""
    problems: list[str] = []
    by_slot: dict[str, list[int]] = {}
    for j in sorted(joins, key=lambda j: j["joined"]):
        if j["ok"]:
            by_slot.setdefault(j["join"], []).append(j["generation"])
    for slot, generations in by_slot.items():
        if generations != sorted(set(generations)):
            problems.append(f"{slot} was released into generations {generations}")
    missing = [m for m in members if 2 not in by_slot.get(m, [])]
    if missing:
        problems.append(f"{len(missing)} members of generation 2 never released into it: {missing[:5]}")
    return problems
