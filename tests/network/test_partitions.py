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
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from launcher.supervisor.policy.classify import ISOLATED, UNREACHABLE
from resilience.contract.lease import lease_s
from resilience.tiers.layout import default_job_id
from tests.network.conftest import STEPS, TRAIN
from tests.support.fencing_checks import stale_copies
from tests.support.sres_runs import Run, clean_env, slot_pids, sres_command

pytestmark = pytest.mark.network

HANG_S = 4.0
"""The supervisor's silence limit; each rank's lease is three quarters of it (3 s)."""


def start(tmp_path: Path, net, *inject: str) -> tuple[subprocess.Popen, Path]:
    """``sres run`` of 2 ranks on the namespaced nodes, the others spares, with ``--inject`` specs."""
    log_dir = tmp_path / "run"
    cmd = sres_command(
        log_dir,
        2,
        ("--spares", str(net.nodes - 2), "--ram-every", "1", *(f"--inject={spec}" for spec in inject)),
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


def assert_replaced_as_unreachable(run: Run, uncut: set[str], nodes: list[int], spares: list[int]) -> None:
    """The run's bits; each of ``nodes`` drained as unreachable, its rank taken by the next spare,
    its rank's log ending in the fence; nothing written late by a replaced generation."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(run.digests().values()) == uncut
    faults = run.of("fault")
    assert [(f["node"], f["kind"], f.get("why")) for f in faults] == [
        (n, "node", UNREACHABLE) for n in nodes
    ], run.rank_logs()
    assert [(e["node"], e["why"]) for e in run.of("drained")] == [(n, UNREACHABLE) for n in nodes]
    replaced = run.of("replaced")
    assert [(e["rank"], e["node"], e["how"]) for e in replaced] == [
        (f["rank"], spare, "spare") for f, spare in zip(faults, spares, strict=True)
    ]
    for fault, took in zip(run.of("network-fault"), replaced):  # none when the test cut the link
        assert took["t"] - fault["t"] < HANG_S + 2  # cut to replaced: within the silence limit
    for node in nodes:
        log = run.log_dir / "ranks" / f"n{node}p0.log"
        assert "fenced, exiting without another write" in log.read_text(), node
    assert stale_copies(run.of, default_job_id({}, run.log_dir)) == []


@pytest.mark.parametrize("network", [3], indirect=True)
@pytest.mark.parametrize("kind", ["cut", "cut-supervisor", "drop-out"])
def test_a_node_cut_off_is_replaced_as_unreachable_and_fenced(tmp_path, network, uncut, kind):
    """At step 8, for good, node 1 loses its link (``cut``); or it and the supervisor's node
    lose each other while its peers still reach it (``cut-supervisor``: a management network
    down); or its packets to the supervisor vanish while the supervisor's still arrive
    (``drop-out``: one direction). Each time its rank hears no echo (the supervisor reads none of
    its lines), fences itself after its lease, and the spare takes its rank; the uncut bits."""
    spec = f"{kind}:1:for=0:step=8"
    run = finish(*start(tmp_path, network, spec))
    assert_replaced_as_unreachable(run, uncut, nodes=[1], spares=[2])
    assert [e["spec"] for e in run.of("network-fault")] == [spec]


@pytest.mark.parametrize("network", [3], indirect=True)
def test_a_slow_then_flapping_link_ends_with_the_uncut_bits(tmp_path, network, uncut):
    """Node 0's link is capped at 200 Mbit/s from step 5 on (slower, no fault: each step's
    neighbour copy, 2.3 MB, shares it with gloo); node 1's link flaps (down and up every 0.2 s for
    2 s) from step 16: TCP carries the run through, or the node is replaced as unreachable.
    Either way the run ends with the uncut bits."""
    specs = ("slow-link:0:mbit=200:step=5", "flap:1:for=2:step=16")
    run = finish(*start(tmp_path, network, *specs))
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(run.digests().values()) == uncut
    assert tuple(e["spec"] for e in run.of("network-fault")) == specs
    said = f"{run.stderr[-3000:]}\n{run.rank_logs()}"
    assert all(e["why"] == UNREACHABLE and e["node"] == 1 for e in run.of("drained")), said
    assert all(f["t"] > run.of("network-fault")[1]["t"] for f in run.of("fault")), said  # the slow link: none


def retransmitted(net, node: int) -> int:
    """TCP segments node ``node``'s kernel sent again (its namespace's own counter)."""
    snmp = subprocess.run(
        ["ip", "netns", "exec", net.namespace(node), "cat", "/proc/net/snmp"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names, values = (line.split() for line in snmp.splitlines() if line.startswith("Tcp:"))
    return int(values[names.index("RetransSegs")])


def median_step_s(run: Run, steps: range) -> float:
    times = [
        json.loads(line)["step_s"]
        for line in (run.log_dir / "step_times.jsonl").read_text().splitlines()
        if json.loads(line)["step"] in steps
    ]
    return statistics.median(times)


@pytest.mark.parametrize("network", [3], indirect=True)
def test_a_lossy_and_a_slow_to_answer_link_end_with_the_uncut_bits(tmp_path, network, uncut):
    """From step 30, node 0's link loses 2% of its packets each way and node 1's holds each packet
    25 ms each way (a forwarder in each link's path: this kernel has no netem). TCP retransmits
    and waits; the last steps are slower, and the run ends with the uncut bits (or a node is
    replaced as unreachable, should a lease run out across the losses: the same bits). Late in the
    run: at 3% and 50 ms from step 5, each step took 1.3 s instead of 0.19 (the neighbour copies,
    2.3 MB a step, cross node 0's link too)."""
    specs = ("lossy:0:percent=2:step=30", "delay:1:ms=25:step=30")
    before = retransmitted(network, 0)
    run = finish(*start(tmp_path, network, *specs))
    said = f"{run.stderr[-3000:]}\n{run.rank_logs()}"
    assert run.returncode == 0, said
    assert set(run.digests().values()) == uncut
    assert sorted(e["spec"] for e in run.of("network-fault")) == sorted(specs)  # asked by two ranks
    assert all(e["why"] == UNREACHABLE for e in run.of("drained")), said
    assert retransmitted(network, 0) > before  # the losses were real: node 0's TCP sent again
    # and so was the delay: a step's all-reduce crosses node 1's link, 50 ms a round trip
    assert median_step_s(run, range(32, STEPS)) - median_step_s(run, range(1, 29)) > 0.04, said
    assert "frames passed" in run.stderr and " lost" in run.stderr  # each forwarder's account


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
    assert_replaced_as_unreachable(run, uncut, nodes=[1], spares=[2])
    assert not any(Path(f"/proc/{pid}").exists() for pid in stale)


@pytest.mark.parametrize("network", [3], indirect=True)
def test_the_supervisor_cut_off_from_every_node_drains_none_and_stops_in_one_line(tmp_path, network):
    """At step 8 the supervisor's node loses every node of the run (``isolate-supervisor``: its
    own link down; the nodes still reach each other). Every process, the spare's too, hears no
    echo and fences itself; the supervisor, reaching no node, blames none: it drains nothing and
    stops with one line (a batch job would requeue and resume from the tiers). No copy of the
    run's state is written once the lease of the last node cut has run out."""
    run = finish(*start(tmp_path, network, "isolate-supervisor:for=0:step=8"))
    assert run.returncode == 1, run.stderr[-3000:]
    assert f"sres: error: {ISOLATED.format(nodes=3)}" in run.stderr.splitlines()
    assert run.of("drained") == []
    cuts = run.of("network-fault")
    assert sorted(e["node"] for e in cuts) == [0, 1, 2]
    for node in range(3):
        log = run.log_dir / "ranks" / f"n{node}p0.log"
        assert "fenced, exiting without another write" in log.read_text(), node
    leases_out = max(e["t"] for e in cuts) + lease_s(HANG_S)
    job = default_job_id({}, run.log_dir)
    late = [
        str(manifest)
        for manifest in Path(os.environ["SRES_RAM_ROOT"]).rglob("manifest.json")
        if (data := json.loads(manifest.read_text()))["job_id"] == job and data["created"] > leases_out
    ]
    assert late == []
