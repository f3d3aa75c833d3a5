"""ForkingProcesses' decisions, against a placement that records what it is asked (no process):
when a rank is forked, when it starts cold and says why, and what a forked rank's exit is."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from launcher.observability.events import EventLog
from launcher.placement.forks import KILLED, ForkingProcesses


class Machines:
    """Two machines of two nodes each; processes are exit codes; a server's stdin is a list."""

    def __init__(self) -> None:
        self.rc: dict[str, int | None] = {}
        self.cold: list[str] = []
        self.sent: dict[str, list[dict]] = {}
        self.on_reply: Callable[[str, dict[str, object]], None] | None = None
        self.lost: set[str] = set()

    def host(self, node: int) -> str:
        return f"gpu{node // 2}"

    def machine(self, node: int) -> str:
        return self.host(node)

    def environ(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "HOST": self.host(node)}  # what the placement adds (srun: the node's name)

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.rc[slot] = None
        self.cold.append(slot)

    def start_server(self, slot, node, command, env, on_reply) -> None:
        assert env["SLOT"] == slot
        self.rc[slot], self.sent[slot], self.on_reply = None, [], on_reply

    def send(self, slot: str, data: bytes) -> bool:
        if self.rc.get(slot) is not None:
            return False
        self.sent[slot].append(json.loads(data))
        return True

    def close_input(self, slot: str) -> None:
        pass

    def rank_lost(self, slot: str) -> int | None:
        return -9 if slot in self.lost else None

    def poll(self, slot: str) -> int | None:
        return self.rc[slot]

    def kill(self, slot: str) -> None:
        self.rc[slot] = -9

    def echo(self, slot: str) -> None:
        pass

    def stop_all(self, timeout_s: float = 30.0) -> None:
        pass


def forking(tmp_path: Path, now: list[float] | None = None) -> tuple[ForkingProcesses, Machines, EventLog]:
    machines, events = Machines(), EventLog(tmp_path / "events.jsonl")
    env = lambda slot, node, local: {"SLOT": slot}  # noqa: E731
    clock = (lambda: now[0]) if now is not None else (lambda: 0.0)
    forks = ForkingProcesses(machines, machines, ["train"], env, events, clock=clock)  # type: ignore[arg-type]
    return forks, machines, events


def kinds(events: EventLog) -> list[tuple]:
    return [(e["event"], e.get("how") or e.get("why")) for e in events.events]


def test_one_server_per_machine(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0, 1, 2])
    assert sorted(s.slot for s in forks.servers.values()) == ["n0f", "n2f"]
    assert kinds(events) == [("fork-server", "started")] * 2


def test_a_rank_waits_for_its_warming_server_and_is_forked_once_it_is_ready(tmp_path: Path) -> None:
    now = [10.0]
    forks, machines, events = forking(tmp_path, now)
    forks.tick([0, 1])
    now[0] = 11.5
    assert forks.spawn("n1p0r1", 1, ["train"], {"SLOT": "n1p0r1"}) is True
    assert forks.poll("n1p0r1") is None and machines.cold == [] and machines.sent["n0f"] == []
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.5})
    forks.tick([0, 1])
    assert machines.sent["n0f"] == [{"fork": "n1p0r1", "env": {"SLOT": "n1p0r1", "HOST": "gpu0"}}]
    assert events.events[-1]["how"] == "ready" and events.events[-1]["seconds"] == 1.5
    assert forks.spawn("n1p0r2", 1, ["train"], {"SLOT": "n1p0r2"}) is True
    assert machines.sent["n0f"][-1] == {"fork": "n1p0r2", "env": {"SLOT": "n1p0r2", "HOST": "gpu0"}}
    assert forks.poll("n1p0r2") is None
    forks.kill("n1p0r2")
    assert machines.sent["n0f"][-1] == {"kill": "n1p0r2"}
    machines.on_reply("n0f", {"exit": "n1p0r2", "code": -9})
    assert forks.poll("n1p0r2") == -9
    assert not any(e["event"] == "fork-fallback" for e in events.events)


def test_a_machine_gets_its_server_with_its_first_rank(tmp_path: Path) -> None:
    """At the run's start as for a satellite's or an expansion's ranks: the first one starts the
    machine's server, and they all wait for it (one import, then forks) instead of each starting
    cold."""
    forks, machines, events = forking(tmp_path)
    assert forks.spawn("n0p0", 0, ["train"], {"SLOT": "n0p0"}) is True  # the run's first rank
    forks.tick([0])
    assert forks.spawn("n4p0", 4, ["train"], {"SLOT": "n4p0"}) is True
    assert forks.spawn("n5p0", 5, ["train"], {"SLOT": "n5p0"}) is True  # the same machine, gpu2
    assert [(e["event"], e["node"], e["how"]) for e in events.events] == [
        ("fork-server", 0, "started"),
        ("fork-server", 4, "started"),
    ]
    assert machines.cold == []
    forks.tick([0])  # not in a plan yet (a resize's joining node): kept for its ranks
    assert machines.rc["n4f"] is None
    assert machines.on_reply is not None
    machines.on_reply("n4f", {"ready": 2.0})
    forks.tick([0, 4, 5])
    assert [m["fork"] for m in machines.sent["n4f"]] == ["n4p0", "n5p0"]


def test_a_rank_waits_for_a_server_at_most_wait_s_then_starts_cold(tmp_path: Path) -> None:
    now = [0.0]
    forks, machines, events = forking(tmp_path, now)
    forks.tick([0])
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    now[0] = 29.0
    assert forks.poll("n0p0r1") is None and machines.cold == []
    now[0] = 30.0
    assert forks.poll("n0p0r1") is None and machines.cold == ["n0p0r1"]  # started cold, running
    assert events.events[-1]["why"] == "its fork server was not ready in 30 s"


def test_a_waiting_rank_starts_cold_when_its_server_dies_and_never_when_killed(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0])
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    forks.spawn("n1p0r1", 1, ["train"], {"SLOT": "n1p0r1"})
    forks.kill("n1p0r1")
    assert forks.poll("n1p0r1") == KILLED
    machines.rc["n0f"] = 1
    forks.tick([0])
    assert machines.cold == ["n0p0r1"] and events.events[-2]["why"] == "its fork server exited with 1"
    assert events.events[-1]["how"] == "restarted"
    # a server started again is not waited for: what killed the last one may kill it too
    assert forks.spawn("n0p0r2", 0, ["train"], {"SLOT": "n0p0r2"}) is False
    assert events.events[-1]["why"] == "its fork server is starting again (the one before exited with 1)"


def test_a_dead_server_takes_its_ranks_and_is_started_again(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0])
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    assert forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"}) is True
    machines.rc["n0f"] = -9
    assert forks.poll("n0p0r1") == KILLED  # it died with its server
    assert forks.spawn("n0p0r2", 0, ["train"], {"SLOT": "n0p0r2"}) is False
    assert events.events[-1]["why"] == "its fork server exited with -9"
    forks.tick([0])
    assert events.events[-1]["how"] == "restarted" and events.events[-1]["exit_code"] == -9
    assert forks.poll("n0p0r1") == KILLED  # still dead under the new server of the same slot


def test_a_rank_seen_lost_by_liveness_is_dead_before_its_server_says_so(tmp_path: Path) -> None:
    forks, machines, _ = forking(tmp_path)
    forks.tick([0])
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    machines.lost.add("n0p0r1")
    assert forks.poll("n0p0r1") == KILLED


def test_a_refused_fork_is_a_dead_process_and_the_server_is_not_asked_again(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0])
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    machines.on_reply("n0f", {"refused": "n0p0r1", "why": "OSError: out of memory"})
    assert forks.poll("n0p0r1") == KILLED
    assert forks.spawn("n0p0r2", 0, ["train"], {"SLOT": "n0p0r2"}) is False
    assert "refused a fork" in events.events[-1]["why"]


def test_a_machine_that_left_the_run_loses_its_server(tmp_path: Path) -> None:
    forks, machines, _ = forking(tmp_path)
    forks.tick([0, 2])
    forks.tick([0])
    assert [s.slot for s in forks.servers.values()] == ["n0f"] and machines.rc["n2f"] == -9
