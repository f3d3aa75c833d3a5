"""FSDP2 (``fully_shard``) state recovered from buddies' memory: real processes, gloo, SIGKILL.

Every FSDP2 shard exists on one rank; its buddy (the same local rank on the next node) holds
a copy of each commit. A replaced rank gets exactly its shards from there, survivors keep
theirs, and the run ends with the parameters and optimizer state of a fault-free run. The
example shards as FSDP2's documentation and torchtitan do: each block, then the root, each call
on a mesh of its own (equal meshes, one mesh to sres); HSDP passes its 2-D mesh in.
"""

from __future__ import annotations

import json

import pytest

from tests.support.sres_runs import sres, sres_run, when_event

STEPS = 16


def fsdp_run(tmp_path, name: str, *flags: str, train_args: tuple[str, ...] = ()):
    return sres_run(
        tmp_path / name,
        "--no-tiers",
        *flags,
        nodes=4,
        steps=STEPS,
        example="train_fsdp",
        train_args=train_args,
    )


def model_digests(run) -> set[str]:
    return {json.loads(p.read_text())["model_digest"] for p in (run.log_dir / "out").glob("rank*.json")}


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory):
    run = fsdp_run(tmp_path_factory.mktemp("fsdp"), "fault-free")
    assert run.returncode == 0, run.stderr
    assert len(model_digests(run)) == 1
    return run


def test_a_lost_node_gets_its_shards_from_its_buddy_and_the_result_is_exact(tmp_path, fault_free):
    run = fsdp_run(tmp_path, "node-lost", "--spares", "1", "--inject", "node:1:step=9")
    assert run.returncode == 0, run.stderr
    assert run.digests() == fault_free.digests()  # every rank's shards and optimizer state
    assert model_digests(run) == model_digests(fault_free)  # the gathered model
    (recovered,) = run.of("recovered")
    assert recovered["source"] == "peer" and recovered["steps_lost"] <= 1  # no tier: a buddy's copy
    (replaced,) = run.of("replaced")
    assert (replaced["rank"], replaced["how"]) == (1, "spare")


def test_losing_both_holders_of_an_fsdp_shard_fails_with_one_clear_line(tmp_path):
    # Node 2 dies as the job re-forms after node 1's loss, before rank 1's shards could move:
    # two kills "at step 6" would race (node 2's may come after rank 1 got its shards back).
    run = fsdp_run(
        tmp_path, "both-lost", "--spares", "2", "--inject", "node:1:step=6", "--inject", "node:2:gen=2"
    )
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "every holder" in lines[0] and "rank 1" in lines[0], run.stderr
    assert run.digests() == {}  # nobody went on with wrong state


def test_hsdp_a_killed_rank_gets_its_shards_from_the_other_replica_group(tmp_path):
    """HSDP on a 2x2 mesh: ranks 1 and 3 hold the same shards, which are therefore not copied
    to buddies (the replication factor of 2 is met); rank 1's come back from rank 3."""
    hsdp = ("--hsdp", "2")
    reference = fsdp_run(tmp_path, "hsdp", train_args=hsdp)
    assert reference.returncode == 0, reference.stderr
    run = fsdp_run(tmp_path, "hsdp-kill", "--inject", "kill:rank=1:step=9", train_args=hsdp)
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference.digests() and model_digests(run) == model_digests(reference)
    recovered = run.of("recovered")
    assert len(recovered) == 1, f"{run.of('fault')}\n{run.stderr[-3000:]}"
    assert recovered[0]["source"] == "peer" and recovered[0]["steps_lost"] <= 1


def test_a_rank_killed_during_the_buddy_copy_rolls_every_rank_back_and_the_result_is_exact(
    tmp_path, fault_free
):
    """Rank 1 dies half-way through sending its copy of commit 9 to its buddy: no rank may
    restore commit 9 (rank 1's shards of it exist nowhere complete), so every rank restores
    commit 8, none a mix of the two."""
    run = fsdp_run(tmp_path, "copy-cut", "--spares", "1", "--inject", "kill-during-copy:rank=1:step=9")
    assert run.returncode == 0, run.stderr
    (fault,) = run.of("fault")
    (recovered,) = run.of("recovered")
    assert recovered["source"] == "peer" and recovered["step"] == 8, (fault, recovered)
    assert run.digests() == fault_free.digests() and model_digests(run) == model_digests(fault_free)


def test_a_snapshot_taken_under_the_next_step_is_the_commits_and_a_kill_during_one_rolls_back_exactly(
    tmp_path, fault_free
):
    """Rank 1's snapshot of commit 8 stalls half-way for 2 s while step 9 runs (its optimizer
    step must wait: a snapshot holding some of step 9 would restore wrong bits); then rank 1 dies
    half-way through its snapshot of commit 9: that commit exists nowhere complete, so every
    rank restores commit 8, from that overlapped snapshot, and ends bitwise fault-free."""
    run = fsdp_run(
        tmp_path,
        "capture-cut",
        "--spares",
        "1",
        "--inject",
        "stall-capture:rank=1:step=8",
        "--inject",
        "kill-during-capture:rank=1:step=9",
    )
    assert run.returncode == 0, run.stderr
    (recovered,) = run.of("recovered")
    assert recovered["source"] == "peer" and recovered["step"] == 8, recovered
    assert run.digests() == fault_free.digests() and model_digests(run) == model_digests(fault_free)


def test_fsdp_state_reshards_from_peers_memory_when_the_world_shrinks_and_grows(tmp_path):
    """4 -> 3 (a node lost, no spare) -> 4 (`sres grow`), no tiers: at each resize every rank
    gets all the old shards from the survivors' memory and cuts its own for the new mesh. The
    whole state entering each new world is bit for bit the one committed in the old world."""
    log_dir = tmp_path / "elastic" / "run"
    replies = {}
    watcher = when_event(
        log_dir,
        lambda e: e["event"] == "resize" and e["to_world"] == 3,
        lambda: replies.setdefault("grow", sres("grow", str(log_dir), "--by", "1")),
    )
    run = sres_run(
        tmp_path / "elastic",
        "--no-tiers",
        "--min-nodes",
        "2",
        "--max-nodes",
        "4",
        "--inject",
        "node:1:step=5",
        nodes=4,
        steps=40,
        example="train_fsdp",
        train_args=("--trace-digests", "--compute-s", "0.1", "--progress-every", "1000"),
    )
    watcher.join(timeout=5)
    assert run.returncode == 0, run.stderr
    assert replies["grow"].returncode == 0, replies["grow"].stderr
    assert [(e["from_world"], e["to_world"]) for e in run.of("resize")] == [(4, 3), (3, 4)], run.stderr
    traced = [json.loads(line) for line in (log_dir / "out" / "digests.jsonl").read_text().splitlines()]
    entries = [t for t in traced if t["at"] == "entry" and t["generation"] > 1]
    assert sorted({t["world_size"] for t in entries}) == [3, 4]
    for entry in entries:
        committed = [
            t
            for t in traced
            if t["at"] == "commit" and t["step"] == entry["step"] and t["generation"] < entry["generation"]
        ][-1]
        assert committed["world_size"] != entry["world_size"]
        assert (entry["model"], entry["optimizer"]) == (committed["model"], committed["optimizer"]), entry
    assert len(model_digests(run)) == 1
