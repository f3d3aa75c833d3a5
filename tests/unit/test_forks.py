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

    def rank_lost(self, slot: str) -> bool:
        return slot in self.lost

    def poll(self, slot: str) -> int | None:
        return self.rc[slot]

    def kill(self, slot: str) -> None:
        self.rc[slot] = -9

    def echo(self, slot: str) -> None:
        pass

    def stop_all(self, timeout_s: float = 30.0) -> None:
        pass


def forking(tmp_path: Path) -> tuple[ForkingProcesses, Machines, EventLog]:
    machines, events = Machines(), EventLog(tmp_path / "events.jsonl")
    env = lambda slot, node, local: {"SLOT": slot}  # noqa: E731
    return ForkingProcesses(machines, machines, ["train"], env, events), machines, events  # type: ignore[arg-type]


def kinds(events: EventLog) -> list[tuple]:
    return [(e["event"], e.get("how") or e.get("why")) for e in events.events]


def test_no_server_before_the_first_step_then_one_per_machine(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0, 1, 2], started=False)
    assert forks.servers == {}
    forks.tick([0, 1, 2], started=True)
    assert sorted(s.slot for s in forks.servers.values()) == ["n0f", "n2f"]
    assert kinds(events) == [("fork-server", "started")] * 2


def test_a_rank_is_forked_once_its_server_is_warm_and_cold_with_a_reason_before(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0, 1], started=True)
    assert forks.spawn("n1p0r1", 1, ["train"], {"SLOT": "n1p0r1"}) is False
    assert machines.cold == ["n1p0r1"] and events.events[-1]["why"] == "its fork server is still warming up"
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.5})
    forks.tick([0, 1], started=True)
    assert events.events[-1]["how"] == "ready" and events.events[-1]["seconds"] == 1.5
    assert forks.spawn("n1p0r2", 1, ["train"], {"SLOT": "n1p0r2"}) is True
    assert machines.sent["n0f"] == [{"fork": "n1p0r2", "env": {"SLOT": "n1p0r2"}}]
    assert forks.poll("n1p0r2") is None
    forks.kill("n1p0r2")
    assert machines.sent["n0f"][-1] == {"kill": "n1p0r2"}
    machines.on_reply("n0f", {"exit": "n1p0r2", "code": -9})
    assert forks.poll("n1p0r2") == -9


def test_a_dead_server_takes_its_ranks_and_is_started_again(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0], started=True)
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    assert forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"}) is True
    machines.rc["n0f"] = -9
    assert forks.poll("n0p0r1") == KILLED  # it died with its server
    assert forks.spawn("n0p0r2", 0, ["train"], {"SLOT": "n0p0r2"}) is False
    assert events.events[-1]["why"] == "its fork server exited with -9"
    forks.tick([0], started=True)
    assert events.events[-1]["how"] == "restarted" and events.events[-1]["exit_code"] == -9
    assert forks.poll("n0p0r1") == KILLED  # still dead under the new server of the same slot


def test_a_rank_seen_lost_by_liveness_is_dead_before_its_server_says_so(tmp_path: Path) -> None:
    forks, machines, _ = forking(tmp_path)
    forks.tick([0], started=True)
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    machines.lost.add("n0p0r1")
    assert forks.poll("n0p0r1") == KILLED


def test_a_refused_fork_is_a_dead_process_and_the_server_is_not_asked_again(tmp_path: Path) -> None:
    forks, machines, events = forking(tmp_path)
    forks.tick([0], started=True)
    assert machines.on_reply is not None
    machines.on_reply("n0f", {"ready": 1.0})
    forks.spawn("n0p0r1", 0, ["train"], {"SLOT": "n0p0r1"})
    machines.on_reply("n0f", {"refused": "n0p0r1", "why": "OSError: out of memory"})
    assert forks.poll("n0p0r1") == KILLED
    assert forks.spawn("n0p0r2", 0, ["train"], {"SLOT": "n0p0r2"}) is False
    assert "refused a fork" in events.events[-1]["why"]


def test_a_machine_that_left_the_run_loses_its_server(tmp_path: Path) -> None:
    forks, machines, _ = forking(tmp_path)
    forks.tick([0, 2], started=True)
    forks.tick([0], started=True)
    assert [s.slot for s in forks.servers.values()] == ["n0f"] and machines.rc["n2f"] == -9
