"""Tier logic without processes: manifests, restore planning, resharding, retention, config."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from resilience.contract import injections
from resilience.tiers import manifest as mf
from resilience.state import snapshot
from resilience.sharded import partition, reshard
from resilience.tiers.restore import Offer, plan_restore
from resilience.tiers.persistent import PersistentTier
from resilience.tiers.ram import RamTier
from resilience.tiers.saver import TierPlace, TierSaver
from resilience.tiers import (
    TierConfig,
    TierConfigError,
    cleanup_job,
    complete_steps,
    job_ram_dir,
    neighbour_node,
    own_root,
)


def snaps(step: int, seed: int = 0) -> dict[str, snapshot.Snapshot]:
    g = torch.Generator().manual_seed(seed)
    state = {
        "model": {"w": torch.randn(33, 7, generator=g), "b": torch.arange(5, dtype=torch.int64)},
        "n": step,
    }
    return {"replicated": snapshot.capture(state, step)}


# --- manifest -----------------------------------------------------------------------------------


def test_write_load_round_trip_is_exact(tmp_path):
    s = snaps(3)
    path = mf.write(tmp_path, "j1", 3, 2, 1, s)
    m = mf.read_manifest(path, "j1", 2)
    assert (m.step, m.world_size, m.rank) == (3, 2, 1) and set(m.files) == {"replicated.bin"}
    for copy in (False, True):
        back = mf.load(path, m, copy=copy)["replicated"]
        assert back.digest() == s["replicated"].digest()
    assert not list(tmp_path.rglob("*.tmp*"))


@pytest.mark.parametrize("where", ["header", "data"])
def test_one_corrupt_byte_is_named(tmp_path, where):
    path = mf.write(tmp_path, "j1", 3, 1, 0, snaps(3))
    victim = path / "replicated.bin"
    data = bytearray(victim.read_bytes())
    data[20 if where == "header" else len(data) - 9] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(mf.CheckpointInvalid, match="replicated.bin"):
        mf.load(path, mf.read_manifest(path))


def test_truncated_manifest_missing_file_other_job_other_world(tmp_path):
    path = mf.write(tmp_path, "j1", 3, 2, 0, snaps(3))
    with pytest.raises(mf.CheckpointInvalid, match="job j1, not j2"):
        mf.read_manifest(path, "j2")
    with pytest.raises(mf.CheckpointInvalid, match="written by 2 ranks, this run has 4"):
        mf.read_manifest(path, "j1", 4)
    text = (path / mf.MANIFEST).read_text()
    (path / mf.MANIFEST).write_text(text[: len(text) // 2])
    with pytest.raises(mf.CheckpointInvalid, match="manifest unreadable"):
        mf.read_manifest(path)
    (path / mf.MANIFEST).write_text(text)
    (path / "replicated.bin").unlink()
    with pytest.raises(mf.CheckpointInvalid, match="replicated.bin: missing"):
        mf.read_manifest(path)


def test_incomplete_checkpoint_is_not_listed_complete(tmp_path):
    mf.write(tmp_path, "j", 5, 2, 0, snaps(5))
    mf.write(tmp_path, "j", 5, 2, 1, snaps(5))
    mf.write(tmp_path, "j", 6, 2, 0, snaps(6))  # rank 1 of step 6 never finished
    assert complete_steps(tmp_path, "j") == {5: 2}


# --- restore planning (pure) ---------------------------------------------------------------------


def offers(tier, step, world, holders=None, owners=None):
    return [Offer(tier, (holders or {}).get(r, r), r, step, world) for r in (owners or range(world))]


def test_own_ram_wins_then_neighbour_then_persistent():
    all_offers = (
        offers("persistent", 8, 2, holders={0: -1, 1: -1})
        + offers("ram", 8, 2)
        + [Offer("neighbour", 1, 0, 8, 2), Offer("neighbour", 0, 1, 8, 2)]
    )
    plan = plan_restore(2, all_offers, -1)
    assert plan.step == 8 and {s.owner: s.tier for s in plan.sources} == {0: "ram", 1: "ram"}
    plan = plan_restore(2, all_offers, -1, frozenset({("ram", 1, 8)}))
    assert plan.tier_of(0) == "ram" and plan.tier_of(1) == "neighbour"
    assert next(s for s in plan.sources if s.owner == 1).holder == 0
    plan = plan_restore(2, all_offers, -1, frozenset({("ram", 1, 8), ("neighbour", 1, 8)}))
    assert plan.tier_of(1) == "persistent"


def test_newest_step_that_every_rank_has_and_only_after_the_peers():
    o = (
        offers("ram", 9, 2, owners=[0])
        + offers("ram", 8, 2)
        + offers("persistent", 5, 2, holders={0: -1, 1: -1})
    )
    assert plan_restore(2, o, -1).step == 8
    assert plan_restore(2, o, 8) is None  # peers already hold step 8
    assert plan_restore(2, o, -1, frozenset({("ram", 0, 8)})).step == 5


def test_replicated_state_is_served_by_another_ranks_copy_of_the_same_step():
    """Found by the 500-fault soak (seed 1, step 389): rank 1's newest RAM copy corrupt, rank 3
    respawned too often to hold the step before, no neighbour copy: the run started over from
    step -1. Replicated state is the same on every rank, so any rank's copy of the step serves."""
    o = [Offer("ram", r, r, 388, 4, interchangeable=True) for r in range(4)] + [
        Offer("ram", r, r, 387, 4, interchangeable=True) for r in (0, 1, 2)
    ]
    plan = plan_restore(4, o, -1, frozenset({("ram", 1, 388)}))
    assert plan.step == 388
    assert [(s.owner, s.of, s.holder) for s in plan.sources] == [(0, 0, 0), (1, 0, 0), (2, 2, 2), (3, 3, 3)]
    sharded = [Offer("ram", r, r, 388, 4) for r in range(4)] + [Offer("ram", r, r, 387, 4) for r in range(4)]
    assert plan_restore(4, sharded, -1, frozenset({("ram", 1, 388)})).step == 387  # a shard is nobody else's


def test_a_rank_takes_another_ranks_copy_only_when_it_has_none_of_its_own():
    o = [Offer("ram", 0, 0, 8, 2, True), Offer("persistent", -1, 1, 8, 2, True)]
    plan = plan_restore(2, o, -1)
    assert [(s.owner, s.tier, s.of) for s in plan.sources] == [(0, "ram", 0), (1, "persistent", 1)]


def test_other_world_size_only_from_a_complete_persistent_checkpoint():
    o = offers("ram", 9, 4) + offers("persistent", 8, 4, holders={r: -1 for r in range(4)})
    plan = plan_restore(2, o, -1)
    assert plan.step == 8 and plan.world_size == 4 and {s.tier for s in plan.sources} == {"persistent"}
    assert plan_restore(2, offers("persistent", 8, 4, owners=[0, 1, 2]), -1) is None


def test_neighbour_node_never_itself():
    assert neighbour_node(0, [0, 1, 2]) == 1 and neighbour_node(2, [2, 0, 1]) == 0
    assert neighbour_node(0, [0, 0]) is None


# --- resharding ------------------------------------------------------------------------------------


def _shard_states(params, world):
    """What ShardedOptimizer.state_dict() gives on each of ``world`` ranks after one AdamW step."""
    owner = partition([p.numel() for p in params], world)
    out = []
    for rank in range(world):
        mine = [p for p, o in zip(params, owner) if o == rank] or [torch.nn.Parameter(torch.zeros(1))]
        opt = torch.optim.AdamW(mine, lr=0.1)
        for p in mine:
            p.grad = torch.ones_like(p)
        opt.step()
        out.append({"world_size": world, "rank": rank, "owner": owner, "local": opt.state_dict()})
    return owner, out


def test_reshard_moves_each_parameter_state_to_its_new_owner():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (50, 7, 30, 30, 3)]
    old_owner, old = _shard_states([torch.nn.Parameter(p.detach().clone()) for p in params], 4)
    new_owner = partition([p.numel() for p in params], 2)
    for rank in range(2):
        state = reshard(old, new_owner, rank, 2)
        mine = [i for i, o in enumerate(new_owner) if o == rank]
        assert state["owner"] == new_owner and state["local"]["param_groups"][0]["params"] == list(
            range(len(mine))
        )
        for local, index in enumerate(mine):
            o = old_owner[index]
            old_local = [i for i, x in enumerate(old_owner) if x == o].index(index)
            assert torch.equal(
                state["local"]["state"][local]["exp_avg"], old[o]["local"]["state"][old_local]["exp_avg"]
            )
        torch.optim.AdamW([params[i] for i in mine], lr=0.1).load_state_dict(state["local"])


# --- retention and cleanup -------------------------------------------------------------------------


def test_cleanup_keeps_the_only_complete_copy(tmp_path):
    ram, persistent = tmp_path / "ram", tmp_path / "persistent"
    config = TierConfig(job_id="j", persistent_dir=str(persistent), persist_every=4)
    from resilience.tiers import record_job_config

    record_job_config(config, ram)
    root = own_root("j", 0, ram)
    for step in (3, 4):
        mf.write(root, "j", step, 1, 0, snaps(step))
    mf.write(persistent, "j", 3, 1, 0, snaps(3))
    assert cleanup_job("j", ram)
    assert mf.steps_in(root) == [4]  # newest RAM step is newer than any persistent copy: kept
    mf.write(persistent, "j", 4, 1, 0, snaps(4))
    assert cleanup_job("j", ram) and not job_ram_dir("j", ram).exists()
    assert not cleanup_job("j", ram)


def test_config_is_validated():
    with pytest.raises(TierConfigError, match="persistent directory"):
        TierConfig(job_id="j", persist_every=3)
    with pytest.raises(ValueError, match="not a job id"):
        TierConfig(job_id="../x")
    with pytest.raises(TierConfigError, match="unknown tier setting"):
        TierConfig.from_mapping({"job_id": "j", "persist_evry": 2})
    with pytest.raises(TierConfigError, match="needs ram"):
        TierConfig(job_id="j", ram=False, neighbour=True)


def test_config_from_yaml_flags_win(tmp_path):
    (tmp_path / "t.yaml").write_text("tiers:\n  persistent_dir: /a\n  persist_every: 5\n  keep_ram: 3\n")
    c = TierConfig.from_yaml(tmp_path / "t.yaml", job_id="j", persist_every=2)
    assert (c.persistent_dir, c.persist_every, c.keep_ram) == ("/a", 2, 3)
    assert TierConfig.from_environ({"SRES_TIERS": c.to_json()}) == c


def test_an_empty_tensor_of_the_last_dtype_round_trips(tmp_path):
    """Its buffer is empty and last in the file: the file still ends where the manifest says."""
    state = {"w": torch.ones(3), "ids": torch.zeros(0, dtype=torch.int64)}
    path = mf.write(tmp_path, "j", 1, 1, 0, {"replicated": snapshot.capture(state, 1)})
    loaded = snapshot.materialize(mf.load(path, mf.read_manifest(path, "j", 1))["replicated"], copy=True)
    assert (
        torch.equal(loaded["w"], state["w"])
        and loaded["ids"].shape == (0,)
        and loaded["ids"].dtype == torch.int64
    )


# --- the saver, without processes -----------------------------------------------------------------


def test_saver_writes_ram_and_every_kth_to_persistent_and_keeps_n(tmp_path):
    events = []
    config = TierConfig(
        job_id="j", neighbour=False, persistent_dir=str(tmp_path / "p"), persist_every=3, fsync=False
    )
    saver = TierSaver(
        config, TierPlace(0, 1, 0), lambda e, **f: events.append((e, f)), node_root=tmp_path / "ram"
    )
    for step in range(7):
        state = {"model": {"w": torch.full((1000,), float(step))}}
        saver.save(step, {"replicated": state, "sharded": {}})
        saver.wait_idle()
    root = own_root("j", 0, tmp_path / "ram")
    assert mf.steps_in(root) == [6, 5]
    assert sorted(complete_steps(tmp_path / "p", "j")) == [3, 6]
    assert saver._buffers_made <= 2
    saver.close()


def test_save_blocks_only_for_the_copy(tmp_path):
    """Slow persistent storage never blocks save(): the lanes drop to the newest pending job."""
    gate = threading.Event()
    config = TierConfig(
        job_id="j", neighbour=False, persistent_dir=str(tmp_path / "p"), persist_every=1, fsync=False
    )
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda e, **f: None, node_root=tmp_path / "ram")
    original = saver.lane("persistent")._work
    saver.lane("persistent")._work = lambda job: (gate.wait(30), original(job))
    for step in range(6):
        saver.save(step, {"replicated": {"w": torch.full((100,), float(step))}})
        saver.wait_ram()
    assert saver._buffers_made <= 2
    gate.set()
    saver.wait_idle()
    assert max(complete_steps(tmp_path / "p", "j")) == 5
    saver.close()


def test_job_id_is_the_slurm_job_id_else_stable_per_log_dir(tmp_path):
    from resilience.tiers import default_job_id

    assert default_job_id({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}, tmp_path) == "4242"
    a = default_job_id({}, tmp_path / "run")
    assert a == default_job_id({}, tmp_path / "run") != default_job_id({}, tmp_path / "other")
    job_ram_dir(a)  # a valid id


def test_kill_all_spec_targets_every_rank():
    from resilience.agent import faults

    (inj,) = injections.parse(["kill-all:step=5"])
    assert inj.spec == "kill-all:step=5"
    assert faults.due([inj], rank=3, node=1, kinds=("kill-all",), step=5) == [inj]
    assert faults.due([inj], rank=3, node=1, kinds=("kill-all",), step=4) == []


def test_flush_holds_ram_steps_and_waits_for_a_rank_one_commit_behind(tmp_path):
    config = TierConfig(
        job_id="j", neighbour=False, persistent_dir=str(tmp_path / "p"), persist_every=0, fsync=False
    )
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda e, **f: None, node_root=tmp_path / "ram")
    root = own_root("j", 0, tmp_path / "ram")
    assert saver.flush_hold(5) == (None, "nothing committed yet")
    for step in range(3):
        saver.save(step, {"replicated": {"w": torch.full((10,), float(step))}})
        saver.wait_ram()
    assert saver.flush_hold(5) == (2, "")
    for step in range(3, 6):  # training goes on: nothing from the held steps on is pruned
        saver.save(step, {"replicated": {"w": torch.full((10,), float(step))}})
    saver.wait_ram()
    assert mf.steps_in(root) == [5, 4, 3, 2, 1]
    later = threading.Timer(0.3, lambda: saver.save(6, {"replicated": {"w": torch.zeros(10)}}))
    later.start()
    assert saver.flush_persistent(6, 10) == (6, "")  # waited for this rank's commit 6
    later.join()
    assert complete_steps(tmp_path / "p", "j") == {6: 1}
    saver.save(7, {"replicated": {"w": torch.zeros(10)}})
    saver.wait_idle()
    assert mf.steps_in(root) == [7, 6]  # flush mode left: retention again
    assert saver.flush_persistent(3, 1)[0] is None
    saver.close()


def test_a_flush_queued_behind_a_slow_copy_is_not_replaced_by_the_next_periodic_one(tmp_path, monkeypatch):
    """CI, 2 cores: the persistent lane was still copying step 0 when the flush's copy of step 2
    queued behind it, and commit 3 (a K-th one) replaced it: the flush said the write failed and
    the requeue had nothing saved. Now the flush's copy is kept and commit 3 queues behind it."""
    config = TierConfig(
        job_id="j", neighbour=False, persistent_dir=str(tmp_path / "p"), persist_every=3, fsync=False
    )
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda e, **f: None, node_root=tmp_path / "ram")
    lane = saver.lane("persistent")
    slow, flush_queued = threading.Event(), threading.Event()
    write, submit = PersistentTier.write, lane.submit
    monkeypatch.setattr(PersistentTier, "write", lambda *a, **k: slow.wait(10) and write(*a, **k))
    monkeypatch.setattr(lane, "submit", lambda job: (submit(job), job.done and flush_queued.set())[0])
    for step in range(3):  # step 0's persistent copy waits at the gate
        saver.save(step, {"replicated": {"w": torch.full((10,), float(step))}})
        saver.wait_ram()
    assert saver.flush_hold(5) == (2, "")
    result: list = []
    flush = threading.Thread(target=lambda: result.append(saver.flush_persistent(2, 10)))
    flush.start()
    assert flush_queued.wait(10)
    saver.save(3, {"replicated": {"w": torch.full((10,), 3.0)}})
    saver.wait_ram()
    slow.set()
    flush.join(10)
    assert result == [(2, "")]
    saver.wait_idle(10)
    assert sorted(complete_steps(tmp_path / "p", "j")) == [2, 3]  # step 0 pruned: two kept
    saver.close()


@pytest.mark.local
def test_a_flush_is_answered_while_training_commits_faster_than_the_ram_tier_writes(tmp_path, monkeypatch):
    """CI, 2 cores: each RAM write took longer than a step, so the lane was never idle; the
    flush waited for it to be, its minute ran out, and the preempted job was requeued a minute
    late with nothing saved. The flush waits for the newest commit made before it asked."""
    config = TierConfig(job_id="j", neighbour=False, persistent_dir=str(tmp_path / "p"), fsync=False)
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda e, **f: None, node_root=tmp_path / "ram")
    write = RamTier.write
    monkeypatch.setattr(RamTier, "write", lambda *a, **k: (time.sleep(0.05), write(*a, **k))[1])
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            saver.save(step, {"replicated": {"w": torch.full((10,), float(step))}})
            step += 1
            time.sleep(0.005)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        time.sleep(0.3)
        assert not saver.lane("ram").wait_idle(1.0)  # the lane is never idle...
        step, why = saver.flush_hold(5)  # ...and the flush is answered all the same
        assert why == "" and step is not None and step >= 3
        assert saver.flush_persistent(step, 5) == (step, "")
    finally:
        stop.set()
        trainer.join()
        saver.close()
    assert step in complete_steps(tmp_path / "p", "j")


# --- replicated state persisted once --------------------------------------------------------------


def _rank_savers(tmp_path, world: int, ram: bool = True, **place):
    events: list[tuple[str, dict]] = []
    config = TierConfig(
        job_id="j", ram=ram, neighbour=False, persistent_dir=str(tmp_path / "p"), persist_every=1, fsync=False
    )
    savers = [
        TierSaver(
            config,
            TierPlace(r, world, r),
            lambda e, **f: events.append((e, f)),
            node_root=tmp_path / "ram",
            **place,
        )
        for r in range(world)
    ]
    return savers, events


def _state(rank: int, model_seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(model_seed)
    return {
        "replicated": {"model": {"w": torch.randn(300, generator=g)}},
        "sharded": {"opt": {"m": torch.full((50,), float(rank))}},
    }


@pytest.mark.parametrize("ram", [True, False], ids=["from-ram-tier", "from-buffers"])
def test_persistent_tier_holds_replicated_state_once_and_each_rank_reads_it_back(tmp_path, ram):
    savers, events = _rank_savers(tmp_path, 3, ram=ram)
    for saver in reversed(savers):  # ranks 1 and 2 start first: they wait for rank 0's copy
        saver.save(4, _state(saver.place.rank))
    for saver in savers:
        saver.wait_idle()
        saver.close()
    root = tmp_path / "p"
    assert complete_steps(root, "j") == {4: 3}
    assert sorted(p.name for p in mf.step_dir(root, 4).glob("rank-*/replicated.bin")) == ["replicated.bin"]
    for rank in range(3):
        path = mf.rank_dir(root, 4, rank)
        m = mf.read_manifest(path, "j", 3)
        assert m.shared == ({} if rank == 0 else {"replicated.bin": 0})
        loaded = {k: snapshot.materialize(v, copy=True) for k, v in mf.load(path, m).items()}
        assert torch.equal(loaded["replicated"]["model"]["w"], _state(rank)["replicated"]["model"]["w"])
        assert torch.equal(loaded["sharded"]["opt"]["m"], _state(rank)["sharded"]["opt"]["m"])
    assert not [e for e, _ in events if e == "tier-warning"]

    # Rank 0's file is every rank's now: corrupting it is reported for the rank that shares it.
    data = bytearray((mf.rank_dir(root, 4, 0) / "replicated.bin").read_bytes())
    data[-10] ^= 0x01
    (mf.rank_dir(root, 4, 0) / "replicated.bin").write_bytes(bytes(data))
    m1 = mf.read_manifest(mf.rank_dir(root, 4, 1), "j", 3)
    with pytest.raises(
        mf.CheckpointInvalid, match=r"rank-00000/replicated.bin \(shared by rank 1\): checksum mismatch"
    ):
        mf.load(mf.rank_dir(root, 4, 1), m1)
    (mf.rank_dir(root, 4, 0) / "replicated.bin").unlink()
    assert complete_steps(root, "j") == {}
    with pytest.raises(mf.CheckpointInvalid, match=r"\(shared by rank 2\): missing"):
        mf.read_manifest(mf.rank_dir(root, 4, 2), "j", 3)


def test_a_rank_whose_replicated_state_differs_writes_its_own_from_its_next_save(tmp_path):
    savers, events = _rank_savers(tmp_path, 2)
    root = tmp_path / "p"
    for step in (2, 4):
        for saver in savers:
            saver.save(step, _state(saver.place.rank, model_seed=saver.place.rank))  # diverged
            saver.wait_idle()
    for saver in savers:
        saver.close()
    (warning,) = [f for e, f in events if e == "tier-warning"]
    assert warning["step"] == 2 and warning["error"] == "replicated state of rank 1 differs from rank 0's"
    shared = mf.read_manifest(mf.rank_dir(root, 2, 1))
    assert shared.shared == {"replicated.bin": 0}
    with pytest.raises(mf.CheckpointInvalid, match="checksum mismatch"):  # never a silent wrong load
        mf.load(mf.rank_dir(root, 2, 1), shared)
    own = mf.read_manifest(mf.rank_dir(root, 4, 1))
    assert own.shared == {} and (mf.rank_dir(root, 4, 1) / "replicated.bin").exists()
    mf.load(mf.rank_dir(root, 4, 1), own)


def test_ram_tier_is_found_by_node_name_whatever_index_the_node_has(tmp_path):
    from resilience.tiers.restore import list_offers

    config = TierConfig(job_id="j", neighbour=False, fsync=False)
    saver = TierSaver(
        config, TierPlace(2, 4, "gpu-a17"), lambda e, **f: None, node_root=tmp_path
    )  # first allocation
    saver.save(6, {"replicated": {"w": torch.ones(8)}})
    saver.wait_idle()
    saver.close()
    # The requeued job runs rank 0 on that host: it offers rank 2's copy from its own RAM tier.
    offers = list_offers(
        config, rank=0, node="gpu-a17", include_shared=False, report=print, ram_base=tmp_path
    )
    assert offers == [Offer("ram", 0, 2, 6, 4, interchangeable=True)]
    assert (
        list_offers(config, rank=0, node="gpu-b02", include_shared=False, report=print, ram_base=tmp_path)
        == []
    )
    with pytest.raises(ValueError, match="not a node name"):
        own_root("j", "../etc", tmp_path)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_pruning_the_persistent_tier_never_leaves_a_step_half_pruned(tmp_path, order):
    """The order that broke a healthy run: rank 1's lane dropped step 10 for a newer one, so the
    ranks' own newest copies differ; rank 0 pruned its part of step 5 (its replicated file,
    which rank 1's manifest of step 5 names) while rank 1 kept step 5. Rank 0 now decides for
    every rank, whole steps: the newest two steps every rank has stay, whole, and step 10 (which
    rank 1 will never write: it has written 15) goes."""
    from resilience.tiers.base import Where
    from resilience.tiers.persistent import PersistentTier

    persistent = tmp_path / "persistent"
    where = Where(TierConfig(job_id="j", persistent_dir=str(persistent)), "n0", tmp_path / "ram")
    for step, ranks in ((5, (0, 1)), (10, (0,)), (15, (0, 1))):
        for rank in ranks:
            share = {"replicated.bin": 0} if rank else None
            mf.write(persistent, "j", step, 2, rank, snaps(step), share=share)
    for rank in order:
        PersistentTier().prune(where, keep=2, owner=rank)
    assert mf.steps_in(persistent) == [15, 5]
    for step in (15, 5):
        for rank in (0, 1):
            path = mf.rank_dir(persistent, step, rank)
            mf.verify(path, mf.read_manifest(path, "j", 2))
    assert complete_steps(persistent, "j") == {15: 2, 5: 2}


@pytest.mark.parametrize("exchange", [True, False])
def test_a_same_step_copy_is_replaced_whole(tmp_path, monkeypatch, exchange):
    """A step written again (a flush after a save of the same step) replaces the copy there:
    swapped in one rename where the filesystem can, else renamed aside first; either way the
    new copy is in place, valid, and nothing temporary is left."""
    if not exchange:
        monkeypatch.setattr(mf, "_exchange", lambda a, b: False)  # as on NFS
    mf.write(tmp_path, "j", 4, 1, 0, snaps(4, seed=1), fsync=True)
    path = mf.write(tmp_path, "j", 4, 1, 0, snaps(4, seed=2), fsync=True)
    loaded = mf.load(path, mf.read_manifest(path, "j"))["replicated"]
    assert loaded.digest() == snaps(4, seed=2)["replicated"].digest()
    assert [p.name for p in mf.step_dir(tmp_path, 4).iterdir()] == ["rank-00000"]


@pytest.mark.parametrize("group", [False, True], ids=["private", "share_group"])
def test_checkpoints_are_the_users_alone_unless_shared_with_the_group_and_never_writable_by_it(
    tmp_path, group
):
    """Whatever the umask (022 once left every step of a shared persistent directory readable by
    all): private by default; ``share_group`` opens reading to the group, never writing."""
    import os
    import stat

    old = os.umask(0o002)  # a project's usual umask
    try:
        path = mf.write(tmp_path, "j", 5, 1, 0, snaps(5), group=group)
        copy = mf.copy_checkpoint(path, tmp_path / "copy", 5, 0, group=group)
    finally:
        os.umask(old)
    for top in (path, copy):
        dirs, files = {top.parent, top}, set(top.iterdir())
        want_dir, want_file = (0o750, 0o640) if group else (0o700, None)
        assert {stat.S_IMODE(d.stat().st_mode) for d in dirs} == {want_dir}, top
        if want_file is not None:
            assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {want_file}, top
        assert mf.load(top, mf.read_manifest(top), verify=True).keys() == snaps(5).keys()
    with pytest.raises(TierConfigError, match="share_group .* needs a persistent directory"):
        TierConfig(job_id="j", share_group=True)
