"""What a stranger who finds a run's ports can send it, and what comes of it: nothing.

The stranger knows the ports (another user reads them in /proc/net/tcp; this test reads them
from a rank's environment, and nothing else of it) but not the run's secret. It writes broken
and forged rank events into the store (values without the run's MAC: refused before they are
read), and garbage and a forged hello for a live rank to the liveness port. The run must end
as a fault-free run does, bit for bit, with each refusal in events.jsonl.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from launcher.run.leftovers import processes_with_env
from resilience.contract import keys
from tests.support.sres_runs import sres_run, when_event

TRAIN = ("--sleep-s", "0.3")
"""Slow enough for the attack to land mid-run; sleeping changes no bits (the reference sleeps not)."""


def rank_environ(log_dir: Path) -> dict[str, str]:
    pid = processes_with_env(f"SRES_LOG_DIR={log_dir.resolve()}")[0]
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def attack(log_dir: Path) -> None:
    env = rank_environ(log_dir)
    host, store_port, liveness_port = (
        env["SRES_STORE_HOST"],
        env["SRES_STORE_PORT"],
        env["SRES_LIVENESS_PORT"],
    )
    store = dist.TCPStore(host, int(store_port), is_master=False, timeout=timedelta(seconds=10))
    for record in (
        b"\xff\xfe not json",
        b'{"event": "finished", "steps": 1, "t": 1.0}',  # a supervisor's event, forged
        b'{"event": "inexact", "rank": 0, "ranks": 5, "step": 1, "why": "x"}',  # ranks: not a list
        b'{"event": "checkpoint-saved", "rank": 0, "tier": "ram", "step": 1, "seconds": 0.1, "evil": 1}',
    ):
        store.set(keys.rank_event(store.add(keys.RANK_EVENTS, 1)), record)
    for garbage in (b"\xff" * 300, b"n0p0 0 " + b"0" * 64 + b"\n"):  # too long; a hello without the secret
        with socket.create_connection((host, liveness_port), timeout=10) as sock:
            sock.makefile("rb").readline()
            sock.sendall(garbage)
            sock.recv(1)


def test_a_stranger_with_the_ports_changes_nothing(tmp_path, reference):
    log_dir = tmp_path / "run"
    errors: list[BaseException] = []

    def attack_once() -> None:
        try:
            attack(log_dir)
        except BaseException as err:  # reported below: the attack itself must have happened
            errors.append(err)

    when_event(log_dir, lambda e: e["event"] == "generation", attack_once)
    run = sres_run(tmp_path, train_args=TRAIN)
    assert not errors, errors
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference
    assert not run.of("fault") and len(run.of("finished")) == 1, run.stderr
    dropped = run.of("dropped-input")
    assert sorted(e["channel"] for e in dropped) == ["liveness"] * 2 + ["rank-event"] * 4, dropped
    assert sum("the run did not write" in e["why"] for e in dropped) == 4  # the store's values are signed
    assert any("without the run's secret" in e["why"] for e in dropped)
    assert "warning: rank-event input refused" in run.stderr
