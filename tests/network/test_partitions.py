"""A node cut off from the network while its processes live: real namespaces, real links taken
down, real TCP that never hears a reset (``tests/support/netns.py``); the real supervisor, ranks,
gloo and tiers (``launcher/placement/namespaced.py``).

What a user checks: the run ends with the bits of the same run without the cut, the node is
drained as unreachable (not dead), and nothing the cut-off node's ranks did after they were
replaced reached any tier: each copy's manifest names the generation that wrote it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.supervisor.policy.classify import UNREACHABLE
from resilience.tiers.layout import default_job_id
from tests.support.sres_runs import Run, clean_env, sres_command, sres_run, slot_pids

pytestmark = pytest.mark.network

STEPS = 40
EXACT = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "2", "--ddp", "exact")
TRAIN = (*EXACT, "--sleep-s", "0.15")
HANG_S = 6.0
"""The supervisor's silence limit; each rank's lease is half of it (3 s)."""


@pytest.fixture(scope="module")
def uncut(tmp_path_factory) -> set[str]:
    """The same run on one loopback, nothing cut: the bits every cut run must end with."""
    run = sres_run(tmp_path_factory.mktemp("uncut"), "--no-tiers", nodes=2, steps=STEPS, train_args=TRAIN)
    assert run.returncode == 0, run.stderr
    return set(run.digests().values())


def start(tmp_path: Path, net) -> tuple[subprocess.Popen, Path]:
    log_dir = tmp_path / "run"
    cmd = sres_command(
        log_dir,
        2,
        ("--spares", "1", "--ram-every", "1"),
        "resilience.examples.train_mlp",
        STEPS,
        TRAIN,
        hang_timeout=HANG_S,
    )
    env = clean_env(SRES_NETNS=net.variable)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, log_dir


def finish(proc: subprocess.Popen, log_dir: Path) -> Run:
    out, err = proc.communicate(timeout=240)
    return Run(proc.returncode, out, err, log_dir)


def started_step(log_dir: Path, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    path = log_dir / "step_times.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines()):
            return
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout_s:g} s")


def stale_copies(run: Run, after_t: float) -> list[str]:
    """Tier copies of this run written by generation 1 after ``after_t`` (its replacement)."""
    job = default_job_id({}, run.log_dir)
    root = Path(os.environ["SRES_RAM_ROOT"])
    stale = []
    for manifest in root.rglob("manifest.json"):
        data = json.loads(manifest.read_text())
        if data["job_id"] == job and data.get("generation", 0) < 2 and data["created"] > after_t:
            stale.append(f"{manifest}: generation {data.get('generation')}")
    return stale


def assert_replaced_as_unreachable(run: Run, uncut: set[str]) -> float:
    """The run's bits, the node's fate; returns when the node was replaced."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(run.digests().values()) == uncut
    (fault,) = run.of("fault")
    assert (fault["node"], fault["kind"], fault["why"]) == (1, "node", UNREACHABLE), fault
    assert [(e["node"], e["why"]) for e in run.of("drained")] == [(1, UNREACHABLE)]
    (replaced,) = run.of("replaced")
    assert (replaced["rank"], replaced["node"], replaced["how"]) == (1, 2, "spare")
    assert "fenced, exiting without another write" in (run.log_dir / "ranks" / "n1p0.log").read_text()
    return replaced["t"]


@pytest.mark.parametrize("network", [3], indirect=True)
def test_a_node_cut_off_is_replaced_as_unreachable_and_its_ranks_fence_themselves(tmp_path, network, uncut):
    """The link of node 1 goes down at step 8 and stays down: its rank hears no echo, fences
    itself after its lease (3 s), and the spare takes its rank; the run ends with the uncut bits."""
    proc, log_dir = start(tmp_path, network)
    started_step(log_dir, 8)
    cut_t = time.time()
    network.cut(1)
    run = finish(proc, log_dir)
    replaced_t = assert_replaced_as_unreachable(run, uncut)
    assert replaced_t - cut_t < HANG_S + 2  # cut to replaced: within the silence limit
    assert stale_copies(run, replaced_t) == []


@pytest.mark.parametrize("network", [3], indirect=True)
def test_a_cut_off_node_that_comes_back_after_its_replacement_writes_nothing(tmp_path, network, uncut):
    """Node 1 freezes (SIGSTOP: a hypervisor pause, a hung kernel) and its link goes down at
    step 8; it is replaced; then its link comes back and it runs again, believing it is still in
    generation 1. Its lease ran out while it was stopped: it writes nothing and exits by itself
    (exit 76, ``FENCED_EXIT``). The supervisor never reached it to kill it (unreachable)."""
    proc, log_dir = start(tmp_path, network)
    started_step(log_dir, 8)
    stale = slot_pids(log_dir, "n1p0")
    assert stale
    for pid in stale:
        os.kill(pid, signal.SIGSTOP)
    network.cut(1)
    deadline = time.monotonic() + 60
    while not (log_dir / "events.jsonl").read_text().count('"event": "replaced"'):
        assert time.monotonic() < deadline, "node 1 was never replaced"
        time.sleep(0.2)
    time.sleep(1.0)
    assert all(Path(f"/proc/{pid}").exists() for pid in stale)  # alive: nobody could kill it
    network.heal(1)
    for pid in stale:
        os.kill(pid, signal.SIGCONT)
    run = finish(proc, log_dir)
    replaced_t = assert_replaced_as_unreachable(run, uncut)
    assert not any(Path(f"/proc/{pid}").exists() for pid in stale)
    assert stale_copies(run, replaced_t) == []
