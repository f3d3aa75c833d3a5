"""The run's ports on a shared node: the coordination store and the liveness port, attacked by a
process of another uid while the victim trains.

The attacker finds the liveness port as any user can (``/proc/net/tcp``, then the greeting);
the store's port is given to it (it greets no one, and a probe of every port is slow but no
secret). It sets the keys that once got node 0 "lost" and drained, the preemption flag that
once requeued the job, forged and broken rank events, and sends garbage and a forged hello for
a live rank. The run must end with its fault-free bits, with no fault, no requeue, no drain.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.security.conftest import victim_run
from tests.support.slurm_cluster import processes_with_env
from tests.support.sres_runs import when_event

pytestmark = pytest.mark.usefixtures("no_ram_roots")

ATTACK = textwrap.dedent(
    """
    import json, socket, sys
    from datetime import timedelta
    from pathlib import Path
    import torch.distributed as dist
    from resilience.contract import keys
    from tests.support.attacker import greeting

    victim_uid, store_port = int(sys.argv[1]), int(sys.argv[2])
    done = []

    liveness = greeting(victim_uid, b"sres-liveness")

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    store.set(keys.node_kill(0), "node:0")  # the two keys that once got node 0 killed and drained
    store.add(keys.NODE_KILLS, 1)
    store.set(keys.PREEMPT, "attacker")  # once: flush, requeue
    for record in (
        b"\\xff\\xfe not json",
        b'{"event": "finished", "steps": 1, "t": 1.0}',
        b'{"event": "checkpoint-saved", "rank": 0, "tier": "ram", "step": 1, "seconds": 0.1}',
    ):
        store.set(keys.rank_event(store.add(keys.RANK_EVENTS, 1)), record)
    done.append("store")
    for host, port in liveness:
        for garbage in (b"\\xff" * 300, b"n0p0 0 " + b"0" * 64 + b"\\n"):
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.makefile("rb").readline()
                sock.sendall(garbage)
                sock.recv(1)
        done.append(f"liveness {port}")
    print(json.dumps(done))
    """
)


def store_port(log_dir: Path) -> str:
    """The store's port (what a probe of the victim's ports would find), from a rank's environment."""
    pid = processes_with_env(f"SRES_LOG_DIR={log_dir.resolve()}")[0]
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    return env["SRES_STORE_PORT"]


def test_a_stranger_on_the_runs_ports_steers_nothing(victim, attacker, victim_reference):
    log_dir = victim.home / "ports"
    outcome: list = []

    def attack() -> None:
        try:
            out = attacker.python(ATTACK, str(victim.uid), store_port(log_dir))
            outcome.append(json.loads(out.stdout) if out.returncode == 0 else out.stderr)
        except Exception as err:  # noqa: BLE001 - shown by the assertion below
            outcome.append(repr(err))

    watcher = when_event(log_dir, lambda e: e["event"] == "generation", attack)
    # 1 s a step: the attacker (torch's import, a probe of each port) lands mid-run on a loaded machine
    run = victim_run(victim, name="ports", train_args=("--sleep-s", "1.0"))
    watcher.join(timeout=60)
    assert outcome and isinstance(outcome[0], list) and len(outcome[0]) == 2, outcome  # store, liveness
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert not run.of("fault") and not run.of("drained") and not run.of("requeue"), run.events
    assert len(run.of("finished")) == 1
    dropped = run.of("dropped-input")
    by_channel = {c: [e for e in dropped if e["channel"] == c] for c in ("store", "rank-event", "liveness")}
    assert len(by_channel["rank-event"]) == 3 and len(by_channel["liveness"]) == 2, dropped
    assert {e["why"].split("'")[1] for e in by_channel["store"]} >= {"inject-node/0", "preempt"}, dropped
