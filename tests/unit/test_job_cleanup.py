"""The epilog's RAM-tier cleanup: what a requeued job restores from stays, the rest goes, and
nothing a user planted in the tree (links, FIFOs) leads the walk outside it or blocks it.

The attacks by a second real uid, with root doing the cleanup, are in tests/security."""

from __future__ import annotations

import os
import time

import pytest
import torch

from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers import neighbour_root, own_root, record_job_config
from resilience.tiers.job_cleanup import Copy, cleanup_job, steps_to_keep
from resilience.tiers.layout import TierConfig, complete_steps

JOB = "77"


def _state(step: int, rank: int) -> dict[str, snapshot.Snapshot]:
    shard = {"w": torch.full((8,), float(step * 10 + rank))}  # each rank's own shard
    return {"sharded": snapshot.capture(shard, step)}


def _cut_off_mid_save(ram, keep_ram: int) -> None:
    """A 2-rank sharded job cut off while saving step 6: rank 0 (node a) saved 5 and 6, its
    buddy copy on node b too; rank 1 (node b) saved 5 only, its buddy copy of 5 on node a."""
    record_job_config(TierConfig(job_id=JOB, keep_ram=keep_ram), ram)
    for step in (4, 5, 6):
        mf.write(own_root(JOB, "a", ram), JOB, step, 2, 0, _state(step, 0))
        mf.write(neighbour_root(JOB, "b", ram), JOB, step, 2, 0, _state(step, 0))
    for step in (4, 5):
        mf.write(own_root(JOB, "b", ram), JOB, step, 2, 1, _state(step, 1))
        mf.write(neighbour_root(JOB, "a", ram), JOB, step, 2, 1, _state(step, 1))
    torn = own_root(JOB, "b", ram) / "step-00000006" / "rank-00001"
    torn.mkdir(parents=True)
    (torn / "sharded.bin").write_bytes(b"half")  # no manifest: the save never finished


def _steps_of_rank(ram, rank: int) -> set[int]:
    found = set()
    for node in ("a", "b"):
        for root in (own_root(JOB, node, ram), neighbour_root(JOB, node, ram)):
            for step in mf.steps_in(root):
                if (root / f"step-{step:08d}" / f"rank-{rank:05d}" / "manifest.json").exists():
                    found.add(step)
    return found


@pytest.mark.parametrize("keep_ram", [1, 2])
def test_a_job_cut_off_mid_save_keeps_the_step_every_rank_can_restore(tmp_path, keep_ram):
    _cut_off_mid_save(tmp_path, keep_ram)
    assert cleanup_job(JOB, tmp_path)
    assert 5 in _steps_of_rank(tmp_path, 0) and 5 in _steps_of_rank(tmp_path, 1)
    assert 4 not in _steps_of_rank(tmp_path, 0)  # older than rank 0's newest keep_ram steps
    assert (4 in _steps_of_rank(tmp_path, 1)) == (keep_ram == 2)
    assert not (own_root(JOB, "b", tmp_path) / "step-00000006").exists()  # the torn copy went


def test_the_rule_keeps_per_rank_and_the_common_step_and_nothing_persisted():
    def copy(node: str, step: int, rank: int) -> Copy:
        return Copy((node, "own", step), rank, 2)

    copies = [copy("a", 5, 0), copy("a", 6, 0), copy("b", 5, 1), copy("b", 4, 1), copy("a", 4, 0)]
    assert steps_to_keep(copies, 1, -1) == {("a", "own", 6), ("a", "own", 5), ("b", "own", 5)}
    assert steps_to_keep(copies, 2, 5) == {("a", "own", 6)}  # step 5 is on the persistent tier
    assert steps_to_keep(copies, 2, 6) == set()


def test_links_and_fifos_in_the_tree_are_removed_not_followed_and_block_nothing(tmp_path):
    ram, outside = tmp_path / "ram", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    _cut_off_mid_save(ram, 2)
    node_a = own_root(JOB, "a", ram)
    fifo_step = node_a / "step-00000007" / "rank-00000"
    fifo_step.mkdir(parents=True)
    os.mkfifo(fifo_step / "manifest.json")  # a reader that waited for a writer would hang here
    (node_a / "step-00000003").symlink_to(outside)  # a step swapped for a link
    (own_root(JOB, "b", ram).parent / "neighbour-x").symlink_to(outside)
    (ram / f"job-{JOB}" / "node-c").symlink_to(outside)  # a whole node swapped for a link
    started = time.monotonic()
    assert cleanup_job(JOB, ram)
    assert time.monotonic() - started < 5
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert (outside / "precious").read_text() == "keep me"
    assert not (ram / f"job-{JOB}" / "node-c").is_symlink()
    assert not (node_a / "step-00000003").is_symlink() and not fifo_step.exists()
    assert 5 in _steps_of_rank(ram, 1)


def test_a_job_directory_that_is_a_link_is_unlinked_and_its_target_untouched(tmp_path):
    ram, outside = tmp_path / "ram", tmp_path / "outside"
    ram.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (ram / f"job-{JOB}").symlink_to(outside)
    assert cleanup_job(JOB, ram)
    assert not (ram / f"job-{JOB}").is_symlink() and (outside / "precious").read_text() == "keep me"


def test_a_fifo_named_manifest_on_the_persistent_tier_does_not_hang_a_reader(tmp_path):
    step = tmp_path / "step-00000004" / "rank-00000"
    step.mkdir(parents=True)
    os.mkfifo(step / "manifest.json")
    started = time.monotonic()
    assert complete_steps(tmp_path, JOB) == {}
    assert time.monotonic() - started < 5
