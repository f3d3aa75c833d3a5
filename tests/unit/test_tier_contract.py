"""Every checkpoint tier passes the same contract (a new tier in the registry runs it too).

Real files in temporary directories; each tier sees them as a rank on node ``gpu-a17`` of
job ``j1`` would (its RAM root is the test's own). Copies are written the way the saver's
lanes write them, through ``Tier.write``: the first tier a job's saves feed from the state
itself, every later one from the first one's copy (``saver.fed_tiers``), with and without the
RAM tier. A tier that sends its copies to the next node (the neighbour tier) sends them over
TCP to a server of this one: a ring of one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.base import Tier, Where
from resilience.tiers.layout import TierConfig
from resilience.tiers.registry import NAMES, TIERS, tier
from resilience.tiers.restore import plan_restore
from resilience.tiers.saver import fed_tiers
from resilience.contract import run_secret
from resilience.tiers.transport import NeighbourServer

WORLD = 2


@dataclass(frozen=True)
class Route:
    """How the saver writes ``tier``: from the state itself (``source`` None), or from
    ``source``'s copy."""

    tier: Tier
    source: Tier | None

    @property
    def id(self) -> str:
        return self.tier.name if self.source is None else f"{self.tier.name}<-{self.source.name}"


def _routes() -> list[Route]:
    out: dict[str, Route] = {}
    for without in ({}, {"ram": False, "neighbour": False}):
        first, *later = fed_tiers(TierConfig(job_id="j1", persistent_dir="/shared", **without))
        for route in [Route(first, None)] + [Route(t, first) for t in later]:
            out.setdefault(route.id, route)
    return list(out.values())


ROUTES = _routes()


@pytest.fixture
def where(tmp_path):
    """``where(job)``: the tiers of a rank on ``gpu-a17``; its next node is this node."""
    servers: dict[str, NeighbourServer] = {}

    def make(job: str = "j1") -> Where:
        config = TierConfig(job_id=job, persistent_dir=str(tmp_path / "shared"))
        plain = Where(config, node="gpu-a17", ram_base=tmp_path / "shm")

        def next_node() -> str:
            if job not in servers:
                root = tier("neighbour").root(plain)
                servers[job] = NeighbourServer(root, job, config.keep_ram, run_secret.new_secret()).start()
            return servers[job].link

        return Where(config, plain.node, plain.ram_base, neighbour=next_node)

    yield make
    for server in servers.values():
        server.stop()


def snaps(step: int) -> dict[str, snapshot.Snapshot]:
    g = torch.Generator().manual_seed(step)
    state = {
        "model": {"w": torch.randn(64, 9, generator=g), "steps": torch.tensor([step])},
        "epoch": step // 3,
    }
    return {"replicated": snapshot.capture(state, step)}


@pytest.fixture(params=ROUTES, ids=[r.id for r in ROUTES])
def route(request) -> Route:
    return request.param


@pytest.fixture
def each_tier(route) -> Tier:
    return route.tier


@pytest.fixture
def write_all(route):
    """``write_all(tier, where, step)``: every rank's copy of ``step``, as the saver writes it."""

    def write(t: Tier, w: Where, step: int) -> None:
        for rank in range(WORLD):
            state = snaps(step + 100 * rank)
            source = state if route.source is None else route.source.write(w, step, WORLD, rank, state)
            assert t.write(w, step, WORLD, rank, source) is not None

    return write


def offered(t: Tier, w: Where) -> tuple[set[tuple[int, int]], list[tuple]]:
    refused: list[tuple] = []
    offers = t.offers(w, holder=0, report=lambda *args: refused.append(args))
    assert all(o.tier == t.name and o.world_size == WORLD for o in offers)
    return {(o.step, o.owner) for o in offers}, refused


def test_round_trip_is_bitwise(each_tier, where, write_all):
    w = where()
    write_all(each_tier, w, 4)
    assert offered(each_tier, w) == ({(4, 0), (4, 1)}, [])
    for rank in range(WORLD):
        back = each_tier.read(w, 4, rank, WORLD)["replicated"]
        assert back.digest() == snaps(4 + 100 * rank)["replicated"].digest()


def test_a_flipped_byte_is_refused_naming_the_tier(each_tier, where, write_all):
    w = where()
    write_all(each_tier, w, 4)
    victim = each_tier.path(w, 4, 1) / "replicated.bin"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0x10
    victim.write_bytes(bytes(data))
    with pytest.raises(mf.CheckpointInvalid, match=f"{each_tier.name} tier: .*replicated.bin"):
        each_tier.read(w, 4, 1, WORLD)
    each_tier.read(w, 4, 0, WORLD)  # the other rank's copy is untouched


def test_a_truncated_manifest_is_refused_and_never_offered(each_tier, where, write_all):
    w = where()
    write_all(each_tier, w, 4)
    manifest = each_tier.path(w, 4, 1) / mf.MANIFEST
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(mf.CheckpointInvalid, match=f"{each_tier.name} tier"):
        each_tier.read(w, 4, 1, WORLD)
    steps, refused = offered(each_tier, w)
    assert (4, 1) not in steps
    assert [(name, owner, step) for name, owner, step, _ in refused] == [(each_tier.name, 1, 4)]


def test_another_jobs_files_are_never_offered(each_tier, where, write_all):
    write_all(each_tier, where(job="other"), 7)
    assert offered(each_tier, where(job="j1")) == (set(), [])
    with pytest.raises(mf.CheckpointInvalid):
        each_tier.read(where(job="j1"), 7, 0, WORLD)


def test_pruning_keeps_the_only_complete_copy(each_tier, where, write_all):
    w = where()
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


def test_pruning_never_counts_or_removes_another_jobs_copies(each_tier, where, write_all):
    """Two jobs in one directory (a shared persistent path): the other job's newer steps must not
    push this job's only copies out, and this job's pruning leaves the other's files alone."""
    mine, other = where(job="j1"), where(job="other")
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
    off = Where(
        TierConfig(job_id="j1", ram=False, neighbour=False), node="gpu-a17", ram_base=tmp_path / "shm"
    )
    assert each_tier.root(off) is None
    assert each_tier.offers(off, 0, lambda *a: None) == []


def test_a_copy_with_nowhere_to_go_is_skipped_not_failed(route, tmp_path):
    """No next node yet (the plan has none): a tier writes as before, or says None (skipped)
    and holds nothing."""
    config = TierConfig(job_id="j1", persistent_dir=str(tmp_path / "shared"))
    w = Where(config, node="gpu-a17", ram_base=tmp_path / "shm", neighbour=lambda: None)
    written = []
    for rank in range(WORLD):
        state = snaps(4 + 100 * rank)
        source = state if route.source is None else route.source.write(w, 4, WORLD, rank, state)
        written.append(route.tier.write(w, 4, WORLD, rank, source))
    held = {(o.step, o.owner) for o in route.tier.offers(w, 0, lambda *a: None)}
    assert held == (set() if written == [None] * WORLD else {(4, 0), (4, 1)})
    assert None not in written or written == [None] * WORLD


def test_every_registered_tier_is_written_the_way_the_saver_writes_it():
    assert {r.tier.name for r in ROUTES} == set(NAMES)


def test_a_restore_reads_from_the_first_registered_tier_that_holds_a_good_copy(where):
    """The registry's order is the restore's preference: with the same step in every tier, each
    rank's copy comes from the first tier, then, as copies fail verification tier by tier, from
    the next."""
    w = where()
    first, *later = fed_tiers(w.config)
    for rank in range(WORLD):
        copy = first.write(w, 4, WORLD, rank, snaps(4 + 100 * rank))
        for t in later:
            t.write(w, 4, WORLD, rank, copy)
    offers = [o for t in TIERS for rank in range(WORLD) for o in t.offers(w, rank, lambda *a: None)]
    bad: set[tuple[str, int, int]] = set()
    for t in TIERS:
        plan = plan_restore(WORLD, offers, after_step=0, bad=frozenset(bad))
        assert plan is not None and plan.step == 4
        assert {plan.tier_of(owner) for owner in range(WORLD)} == {t.name}
        bad |= {(t.name, owner, 4) for owner in range(WORLD)}
    assert plan_restore(WORLD, offers, after_step=0, bad=frozenset(bad)) is None
    with pytest.raises(KeyError, match="no checkpoint tier 'tape'"):
        tier("tape")
