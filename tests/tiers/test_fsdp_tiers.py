"""FSDP2 state through the checkpoint tiers: a persistent checkpoint of 4 ranks restores on 3
and on 2 ranks (resharded), and the tiers serve a shard whose every in-memory holder is lost.
Real processes, gloo, SIGKILL; the gathered model and optimizer state are compared."""

from __future__ import annotations

import json
import shutil

import pytest

from resilience.contract.messages import STUCK_EXIT
from resilience.tiers import complete_steps
from tests.support.tier_runs import K, dump, restored, sres_tiers

SAVED_AT = 2 * K  # the last step of the saving run, a persisted one (step % K == 0)


def gathered(run) -> set[tuple[str, str]]:
    """(model, optimizer) digests of the whole state, as each rank computed them."""
    outs = [json.loads(p.read_text()) for p in (run.log_dir / "out").glob("rank*.json")]
    return {(o["model_digest"], o["optimizer_digest"]) for o in outs}


def fsdp_tiers(tmp_path, ram_root, name: str, *flags: str, nodes: int, steps: int, job: str, persistent):
    return sres_tiers(
        tmp_path,
        ram_root,
        *flags,
        name=name,
        job=job,
        nodes=nodes,
        steps=steps,
        persistent=persistent,
        example="train_fsdp",
        train_args=("--progress-every", "1000"),
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 4-rank FSDP2 run whose last step is on the persistent tier; its gathered state."""
    tmp = tmp_path_factory.mktemp("fsdp-saved")
    ram = tmp / "ram"
    ram.mkdir()
    run = fsdp_tiers(
        tmp, ram, "saved", nodes=4, steps=SAVED_AT + 1, job="fsdp-saved", persistent=tmp / "persistent"
    )
    assert run.returncode == 0, dump(run)
    assert SAVED_AT in complete_steps(tmp / "persistent", "fsdp-saved")
    (state,) = gathered(run)
    return tmp / "persistent", state


@pytest.mark.parametrize("nodes", [3, 2])
def test_a_persistent_fsdp_checkpoint_of_4_ranks_restores_on_fewer(tmp_path, ram_root, saved, nodes):
    """The new ranks assemble each tensor from the 4 saved shards and cut their own: the whole
    state, gathered again, is the one saved (no step is trained after the restore)."""
    persistent, state = saved
    run = fsdp_tiers(
        tmp_path,
        ram_root,
        f"on-{nodes}",
        nodes=nodes,
        steps=SAVED_AT + 1,
        job="fsdp-saved",
        persistent=persistent,
    )
    assert run.returncode == 0, dump(run)
    event = restored(run)
    assert event["step"] == SAVED_AT and set(event["tiers"].values()) == {"persistent"}, dump(run)
    assert len(event["tiers"]) == 4  # the checkpoint's 4 ranks, resharded
    assert gathered(run) == {state}


def test_losing_both_holders_of_a_shard_restores_from_the_persistent_tier(tmp_path, ram_root):
    """Nodes 1 and 2 die together: rank 1's shards and their only buddy copy are gone, and so are
    the RAM-tier copies on node 1 and its neighbour copy (on node 2). The persistent tier serves
    rank 1 (the others restore the same step from their cheaper tiers); the result is exact."""
    steps = 3 * K + 2
    reference = fsdp_tiers(
        tmp_path,
        ram_root,
        "reference",
        nodes=4,
        steps=steps,
        job="fsdp-reference",
        persistent=tmp_path / "reference-persistent",
    )
    assert reference.returncode == 0, dump(reference)
    shutil.rmtree(ram_root / "job-fsdp-reference", ignore_errors=True)
    run = fsdp_tiers(
        tmp_path,
        ram_root,
        "both-lost",
        "--spares",
        "2",
        "--inject",
        f"node:1:step={K + 2}",
        "--inject",
        "node:2:gen=2",  # during the re-formation
        nodes=4,
        steps=steps,
        job="fsdp-both",
        persistent=tmp_path / "persistent",
    )
    assert run.returncode == 0, dump(run)
    event = restored(run)
    assert event["tiers"]["1"] == "persistent" and event["source"] == "persistent", dump(run)
    # A survivor caught in gloo's connect to rank 2 as it dies (the fault is injected during the
    # re-formation) ends itself with STUCK_EXIT and is restarted in place: that is no node fault,
    # and a generation it ends recovers as any other.
    faults = run.of("fault")
    lost = sorted(f["rank"] for f in faults if f["kind"] != f"exit {STUCK_EXIT}")
    assert lost == [1, 2], dump(run)  # the two nodes, nothing else
    recovered = run.of("recovered")  # one per generation a fault ended
    assert len(recovered) == len({f["generation"] for f in faults}), dump(run)
    assert all(r["steps_lost"] <= K for r in recovered), dump(run)  # <= persist interval
    assert run.digests() == reference.digests() and gathered(run) == gathered(reference)
