"""The batch cache in real runs (two simulated nodes, the node's producer a process of its own):
every rank killed with the producer alive, the producer killed, and what the cache holds.

Each run's ranks read their micro-batches from ``resilience.BatchCache``; each must end with the
bits of a fault-free run that makes its batches in the loop, without any cache.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from resilience.elastic import coverage
from tests.support.slurm_cluster import processes_with_env
from tests.support.sres_runs import slot_of, when_event
from tests.support.tier_runs import dump, sres_tiers

DATA = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "4")
CACHED = (*DATA, "--batch-cache", "--prefetch", "4", "--lookback", "2")
STEPS = 14


def trained(run) -> set[tuple[str, float]]:
    """Each rank's final parameters (SHA-256 of their bits) and last loss. (A run's whole state
    digest also covers what it registered, and a cached loop registers its cache too.)"""
    assert run.returncode == 0, dump(run)
    found = [json.loads(p.read_text()) for p in sorted((run.log_dir / "out").glob("rank*.json"))]
    return {(r["model_digest"], r["loss"]) for r in found}


@pytest.fixture(scope="module")
def uncached(tmp_path_factory) -> set[tuple[str, float]]:
    """The fault-free result of the same loop, batches made in the loop."""
    tmp = tmp_path_factory.mktemp("uncached")
    return trained(sres_tiers(tmp, tmp / "ram", job="uncached", train_args=DATA))


def assert_each_step_once(log_dir: Path) -> None:
    cov = coverage(log_dir)
    assert cov.steps == STEPS and not cov.gaps and not cov.overlaps, cov


def test_every_rank_killed_the_restarted_ranks_first_batch_comes_from_the_cache(tmp_path, ram_root, uncached):
    run = sres_tiers(tmp_path, ram_root, "--inject", "kill-all:step=8", train_args=CACHED)
    assert run.returncode == 0, dump(run)
    assert trained(run) == uncached
    assert [e["how"] for e in run.of("batch-producer")] == ["started", "started"], dump(
        run
    )  # never restarted
    restored = run.of("restored")
    after = [e for e in run.of("first-batch") if e["generation"] > 1]
    assert restored and len(after) == 2, dump(run)
    assert {e["source"] for e in after} == {"cache"}, after
    assert {e["step"] for e in after} == {restored[0]["step"] + 1}
    assert_each_step_once(run.log_dir)
    assert not list(ram_root.iterdir()), "a finished run removes its caches with its RAM tier"


def test_a_killed_producer_is_restarted_and_no_step_is_skipped_or_repeated(tmp_path, ram_root, uncached):
    log_dir = tmp_path / "run"
    killed: list[int] = []

    def kill_producer() -> None:
        pids = slot_pids(log_dir, "n0b")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed.extend(pids)

    watcher = when_event(log_dir, lambda e: e["event"] == "first-batch", kill_producer)
    run = sres_tiers(tmp_path, ram_root, train_args=(*CACHED, "--sleep-s", "0.3"))
    watcher.join(timeout=5)
    assert run.returncode == 0, dump(run)
    assert len(killed) == 1, killed
    producers = [(e["node"], e["how"], e.get("exit_code")) for e in run.of("batch-producer")]
    assert (0, "restarted", -signal.SIGKILL) in producers, producers
    assert trained(run) == uncached
    assert_each_step_once(run.log_dir)
    assert not run.of("fault"), "a producer's death is no fault of the run"


def test_four_ranks_of_a_node_map_one_copy_of_their_batches(tmp_path, ram_root):
    """One node, four ranks: the cache holds each step's batches once (the node's share of the
    global batch), for at most prefetch + lookback + 1 steps, and the ranks map those pages
    shared, never as memory of their own."""
    log_dir = tmp_path / "run"
    seen: dict[str, object] = {}

    def measure() -> None:
        time.sleep(1.0)
        files = sorted(ram_root.rglob("step-*.batch"))
        seen["files"] = [(f.name, f.stat().st_size) for f in files]
        seen["copied"] = seen["mapped"] = 0
        pids = slot_pids(log_dir, "n0p")
        for _ in range(100):  # a rank maps its entry while its step runs: look often
            for pid in pids:
                mapped, copied = _mapped_kb(pid, str(ram_root))
                seen["mapped"] = max(seen["mapped"], mapped)
                seen["copied"] += copied
            time.sleep(0.02)

    watcher = when_event(log_dir, lambda e: e["event"] == "first-batch", measure)
    run = sres_tiers(
        tmp_path,
        ram_root,
        "--procs-per-node",
        "4",
        nodes=1,
        train_args=(*CACHED, "--sleep-s", "0.3", "--width", "1024"),
    )
    watcher.join(timeout=10)
    assert run.returncode == 0, dump(run)
    steps = {name.split("-")[1] for name, _ in seen["files"]}
    entry = max(size for _, size in seen["files"])
    sample = 2 * 1024 * 4  # x and y, float32
    assert len(steps) <= 4 + 2 + 2, steps  # prefetch + lookback + the step at hand, one more being made
    assert len(seen["files"]) <= 4 * len(steps)  # one entry per rank and step: one copy, not one per rank
    assert entry < 1.1 * (24 // 4) * sample  # a rank's entry is its share of the step's samples
    assert seen["mapped"] > 0 and seen["copied"] == 0, seen  # mapped, no page copied


def slot_pids(log_dir: Path, slot_prefix: str) -> list[int]:
    """The run's processes whose slot starts with ``slot_prefix``."""
    ours = processes_with_env(f"SRES_LOG_DIR={log_dir.resolve()}")
    return [pid for pid in ours if (slot_of(pid) or "").startswith(slot_prefix)]


def _mapped_kb(pid: int, under: str) -> tuple[int, int]:
    """kB of ``pid``'s mappings of files under ``under``: resident, and its own copies of their
    pages (``Anonymous`` in smaps: what a private mapping copied; /dev/shm's pages count once,
    in the file, however many processes map them)."""
    mapped = copied = 0
    current = False
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return 0, 0
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:
            current = len(fields) >= 6 and fields[5].startswith(under)
        elif current and fields[0] == "Rss:":
            mapped += int(fields[1])
        elif current and fields[0] == "Anonymous:":
            copied += int(fields[1])
    return mapped, copied
