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
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from resilience.contract import keys
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
    plan = store.get(keys.plan(1))  # there: the run's first generation has begun
    done.append("read in the clear" if b"n0p0" in plan else "sealed")
    store.add(keys.RANK_EVENTS, 10**12)  # a gap no writer makes: once, sres run never ended
    store.add(keys.join(2), -1000)  # once, the next re-formation waited forever
    store.set(keys.heartbeat("n1p0"), b"1" * 48)  # unsigned: absent; a bumped counter once hid a hang
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
    assert outcome and isinstance(outcome[0], list) and len(outcome[0]) == 3, outcome  # store, liveness
    assert outcome[0][0] == "sealed", outcome  # the plan's slots and hosts, the tier's address
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert not run.of("fault") and not run.of("drained") and not run.of("requeue"), run.events
    assert len(run.of("finished")) == 1
    dropped = run.of("dropped-input")
    by_channel = {c: [e for e in dropped if e["channel"] == c] for c in ("store", "rank-event", "liveness")}
    assert len(by_channel["rank-event"]) == 4 and len(by_channel["liveness"]) == 2, dropped
    assert "the counter was moved past them" in by_channel["rank-event"][-1]["why"], dropped
    # inject-node/0 is never read: only a run that injects a node loss looks for it
    assert {e["why"].split("'")[1] for e in by_channel["store"]} >= {"preempt"}, dropped


FLOOD = textwrap.dedent(
    """
    import json, resource, socket, sys, time
    from pathlib import Path
    from tests.support.attacker import listening

    victim_uid, per_port, stop = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))  # any user may
    held, opened = [], {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the victim's ports as they come up, each topped up
        for host, port in listening(victim_uid):
            for _ in range(per_port - opened.get(port, 0)):
                try:
                    held.append(socket.create_connection((host, port), timeout=0.5))
                    opened[port] = opened.get(port, 0) + 1
                except OSError:
                    break  # its backlog is full (a server that accepts slower): the next round
        if len(opened) >= 6 and all(n >= per_port for n in opened.values()):
            break
    print(json.dumps(opened), flush=True)
    while not stop.exists():  # held, silent, until the victim's run has been asked for its status
        time.sleep(0.1)
    """
)


def test_idle_connections_to_every_port_of_the_run_end_nothing(victim, attacker, victim_reference, tmp_path):
    """Finding 4: about 1,100 idle connections to a rank's gloo port aborted both ranks
    (``accept: Too many open files``); to the control port, the supervisor died of ``EMFILE``.
    The attacker (its soft limit raised, as any user may) opens 1,100 to every port of the
    victim's it sees; the run ends with its fault-free bits, and the victim's ``sres status``
    answers in the middle of the flood."""
    log_dir = victim.home / "flood"
    stop = tmp_path / "stop"
    tmp_path.chmod(0o755)
    outcome: dict = {}

    def attack() -> None:
        flood = attacker.popen([sys.executable, "-c", FLOOD, str(victim.uid), "1100", str(stop)])
        try:
            assert flood.stdout is not None
            outcome["opened"] = json.loads(flood.stdout.readline() or "{}")
            sres = str(Path(sys.executable).parent / "sres")
            status = victim.run([sres, "status", str(log_dir)], timeout=60)
            outcome["status"] = (status.returncode, status.stdout + status.stderr)
        except Exception as err:  # noqa: BLE001 - shown by the assertions below
            outcome["error"] = repr(err)
        finally:
            stop.touch()
            flood.communicate(timeout=60)

    def control_port() -> None:  # root reads the victim's private log dir; the attacker floods all
        outcome["control"] = json.loads((log_dir / "control.json").read_text())["port"]
        attack()

    watcher = when_event(log_dir, lambda e: e["event"] == "checkpoint-saved", control_port)  # all up
    # 2 s a step (28 s): the flood's ramp (up to 20 s on a loaded machine) ends before the run
    run = victim_run(victim, name="flood", train_args=("--sleep-s", "2.0"), open_files=1024)
    watcher.join(timeout=120)
    assert "error" not in outcome, outcome
    opened = {int(port): n for port, n in outcome["opened"].items()}
    assert opened.get(outcome["control"], 0) >= 500, opened  # the control port was flooded
    assert len([n for n in opened.values() if n >= 1000]) >= 3, opened  # and the others
    assert outcome["status"][0] == 0, outcome["status"]
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert not run.of("fault") and len(run.of("finished")) == 1, run.events


RECORD = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from pathlib import Path
    import torch.distributed as dist
    from resilience.contract import keys

    port, key, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    if out.exists():  # the second run: put the first run's value back
        store.set(key, out.read_bytes())
    else:
        out.write_bytes(store.get(key))
    print("done")
    """
)


def test_a_plan_recorded_from_one_run_and_replayed_into_the_next_is_refused(
    victim, attacker, victim_reference
):
    """The same log dir keeps its secret across runs (a requeued job, a rerun). The attacker
    records run 1's second plan (sealed, as the run wrote it) and sets it in run 2: run 2 once
    formed run 1's membership, drained a node and never ended. Values are sealed under a key of
    each supervisor start, so the copy does not open there."""
    log_dir, stolen = victim.home / "replay", attacker.home / "plan-2"
    stolen.unlink(missing_ok=True)
    outcome: list[str] = []

    def replay() -> None:
        done = attacker.python(RECORD, store_port(log_dir), keys.plan(2), str(stolen))
        outcome.append(done.stdout.strip() or done.stderr)

    first = when_event(log_dir, lambda e: e["event"] == "recovered", replay)
    # 1 s a step: the attacker (torch's import) reaches the store before the run ends
    run1 = victim_run(
        victim, "--inject", "kill:rank=1:step=5", name="replay", train_args=("--sleep-s", "1.0")
    )
    first.join(timeout=60)
    assert run1.returncode == 0 and run1.digests() == victim_reference, run1.stderr
    assert outcome == ["done"] and stolen.stat().st_size > 0, outcome

    (log_dir / "events.jsonl").unlink()  # the watcher waits for run 2's own first generation
    shutil.rmtree(victim.home / "replay.persistent-2", ignore_errors=True)
    second = when_event(log_dir, lambda e: e["event"] == "generation", replay)
    run2 = victim_run(
        victim,
        name="replay",
        again=True,
        persistent=victim.home / "replay.persistent-2",
        train_args=("--sleep-s", "1.0"),
    )
    second.join(timeout=60)
    assert outcome == ["done", "done"], outcome
    assert run2.returncode == 0, run2.stderr
    assert run2.digests() == victim_reference
    # The ranks read the copy (each polls for the next plan) and took it for absent.
    assert not run2.of("fault") and not run2.of("drained") and len(run2.of("generation")) == 1, run2.events
