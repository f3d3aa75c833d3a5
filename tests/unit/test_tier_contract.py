"""Every checkpoint tier passes the same contract (a new tier in the registry runs it too).

Real files in temporary directories; each tier sees them as a rank on node ``gpu-a17`` of
job ``j1`` would (its RAM root is the test's own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.base import Tier, Where
from resilience.tiers.layout import TierConfig
from resilience.tiers.registry import NAMES, TIERS, cost, tier

WORLD = 2


def where(tmp_path: Path, job: str = "j1") -> Where:
    config = TierConfig(job_id=job, persistent_dir=str(tmp_path / "shared"))
    return Where(config, node="gpu-a17", ram_base=tmp_path / "shm")


def snaps(step: int) -> dict[str, snapshot.Snapshot]:
    g = torch.Generator().manual_seed(step)
    state = {"model": {"w": torch.randn(64, 9, generator=g), "steps": torch.tensor([step])}, "epoch": step // 3}
    return {"replicated": snapshot.capture(state, step)}


def write_all(t: Tier, w: Where, step: int) -> None:
    for rank in range(WORLD):
        t.write(w, step, WORLD, rank, snaps(step + 100 * rank))


def offered(t: Tier, w: Where) -> tuple[set[tuple[int, int]], list[tuple]]:
    refused: list[tuple] = []
    offers = t.offers(w, holder=0, report=lambda *args: refused.append(args))
    assert all(o.tier == t.name and o.world_size == WORLD for o in offers)
    return {(o.step, o.owner) for o in offers}, refused


@pytest.fixture(params=TIERS, ids=NAMES)
def each_tier(request) -> Tier:
    return request.param


def test_round_trip_is_bitwise(each_tier, tmp_path):
    w = where(tmp_path)
    write_all(each_tier, w, 4)
    assert offered(each_tier, w) == ({(4, 0), (4, 1)}, [])
    for rank in range(WORLD):
        back = each_tier.read(w, 4, rank, WORLD)["replicated"]
        assert back.digest() == snaps(4 + 100 * rank)["replicated"].digest()


def test_a_flipped_byte_is_refused_naming_the_tier(each_tier, tmp_path):
    w = where(tmp_path)
    write_all(each_tier, w, 4)
    victim = each_tier.path(w, 4, 1) / "replicated.bin"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0x10
    victim.write_bytes(bytes(data))
    with pytest.raises(mf.CheckpointInvalid, match=f"{each_tier.name} tier: .*replicated.bin"):
        each_tier.read(w, 4, 1, WORLD)
    each_tier.read(w, 4, 0, WORLD)  # the other rank's copy is untouched


def test_a_truncated_manifest_is_refused_and_never_offered(each_tier, tmp_path):
    w = where(tmp_path)
    write_all(each_tier, w, 4)
    manifest = each_tier.path(w, 4, 1) / mf.MANIFEST
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(mf.CheckpointInvalid, match=f"{each_tier.name} tier"):
        each_tier.read(w, 4, 1, WORLD)
    steps, refused = offered(each_tier, w)
    assert (4, 1) not in steps
    assert [(name, owner, step) for name, owner, step, _ in refused] == [(each_tier.name, 1, 4)]


def test_another_jobs_files_are_never_offered(each_tier, tmp_path):
    write_all(each_tier, where(tmp_path, job="other"), 7)
    assert offered(each_tier, where(tmp_path, job="j1")) == (set(), [])
    with pytest.raises(mf.CheckpointInvalid):
        each_tier.read(where(tmp_path, job="j1"), 7, 0, WORLD)


def test_pruning_keeps_the_only_complete_copy(each_tier, tmp_path):
    w = where(tmp_path)
    write_all(each_tier, w, 3)
    write_all(each_tier, w, 5)
    for rank in range(WORLD):  # the newest save broke half way: its manifests never came
        (each_tier.path(w, 5, rank) / mf.MANIFEST).unlink()
    each_tier.prune(w, keep=1)
    assert {s for s, _ in offered(each_tier, w)[0]} == {3}
    write_all(each_tier, w, 8)
    each_tier.prune(w, keep=1)
    assert offered(each_tier, w)[0] == {(8, 0), (8, 1)}
    assert mf.steps_in(each_tier.root(w)) == [8]


def test_pruning_never_counts_or_removes_another_jobs_copies(each_tier, tmp_path):
    """Two jobs in one directory (a shared persistent path): the other job's newer steps must not
    push this job's only copies out, and this job's pruning leaves the other's files alone."""
    mine, other = where(tmp_path, job="j1"), where(tmp_path, job="other")
    write_all(each_tier, mine, 3)
    write_all(each_tier, other, 7)
    write_all(each_tier, other, 9)
    each_tier.prune(mine, keep=1)
    each_tier.prune(mine, keep=1, owner=0)
    assert offered(each_tier, mine)[0] == {(3, 0), (3, 1)}
    write_all(each_tier, mine, 5)
    each_tier.prune(mine, keep=1)
    assert offered(each_tier, mine)[0] == {(5, 0), (5, 1)}
    assert offered(each_tier, other)[0] == {(s, r) for s in (7, 9) for r in range(WORLD)}


def test_a_tier_that_is_off_offers_nothing(each_tier, tmp_path):
    off = Where(TierConfig(job_id="j1", ram=False, neighbour=False), node="gpu-a17", ram_base=tmp_path / "shm")
    assert each_tier.root(off) is None
    assert each_tier.offers(off, 0, lambda *a: None) == []


def test_the_registry_orders_tiers_cheapest_first():
    assert NAMES == ("ram", "neighbour", "persistent")
    assert [cost(n) for n in NAMES] == [0, 1, 2] and tier("neighbour") is TIERS[1]
    with pytest.raises(KeyError, match="known: ram, neighbour, persistent"):
        tier("tape")
