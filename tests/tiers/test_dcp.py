"""DCP save/load through TieredStorageWriter/TieredStorageReader, with real gloo process groups."""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from launcher.cli.parser import main
from resilience.tiers import manifest as mf
from resilience.tiers import TieredStorageReader, TieredStorageWriter

ROWS, COLS = 12, 5


def _full() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_group(body, rank: int, world: int, port: int, *args) -> None:
    """Run ``body`` in a gloo group, and leave only after everything it made is freed.

    DTensor's collectives leave work objects that hold the mesh's group and tensors. Freed
    only at interpreter exit, they found gloo's threads still joinable and the worker died
    of std::terminate (SIGABRT) after passing: about 1 load in 20 under CI load. Returning
    from ``body`` frees its DTensors and mesh; then the barrier, then the group.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        body(world, *args)
        gc.collect()
        dist.barrier()  # no rank leaves (rank 0 hosts the store) while another still talks to it
    finally:
        dist.destroy_process_group()


def _sharded(full: torch.Tensor, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(0)])


def _save(world: int, tmp: str, asynchronous: bool) -> None:
    state = {"weight": _sharded(_full(), world), "step": torch.tensor(7)}
    writer = TieredStorageWriter(
        7, job_id="dcpjob", persistent_dir=f"{tmp}/persistent", ram_root=Path(tmp) / "ram"
    )
    if asynchronous:
        dcp.async_save(state, storage_writer=writer).result()
    else:
        dcp.save(state, storage_writer=writer)


def _load(world: int, tmp: str, expect_tier: str) -> None:
    state = {"weight": _sharded(torch.zeros(ROWS, COLS), world), "step": torch.tensor(0)}
    reader = TieredStorageReader(
        job_id="dcpjob", persistent_dir=f"{tmp}/persistent", ram_root=Path(tmp) / "ram"
    )
    assert reader.tier == expect_tier, (reader.tier, reader.refused)
    dcp.load(state, storage_reader=reader)
    assert torch.equal(state["weight"].full_tensor(), _full())
    assert int(state["step"]) == 7


def _save_worker(rank: int, world: int, port: int, tmp: str, asynchronous: bool) -> None:
    _in_group(_save, rank, world, port, tmp, asynchronous)


def _load_worker(rank: int, world: int, port: int, tmp: str, expect_tier: str) -> None:
    _in_group(_load, rank, world, port, tmp, expect_tier)


def _spawn(fn, world: int, *args) -> None:
    mp.start_processes(fn, args=(world, _port(), *args), nprocs=world, join=True, start_method="spawn")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["save", "async_save"])
def test_round_trip_and_load_on_another_world_size(tmp_path, asynchronous):
    _spawn(_save_worker, 2, str(tmp_path), asynchronous)
    ram = tmp_path / "ram" / "job-dcpjob" / "dcp" / "step-00000007"
    assert (ram / mf.MANIFEST).exists() and (
        tmp_path / "persistent" / "dcp" / "step-00000007" / mf.MANIFEST
    ).exists()
    _spawn(_load_worker, 2, str(tmp_path), "ram")  # same world size, RAM tier
    _spawn(_load_worker, 3, str(tmp_path), "ram")  # resharded by DCP onto 3 ranks


def test_corrupt_ram_copy_falls_back_to_persistent_and_says_why(tmp_path, capsys):
    _spawn(_save_worker, 2, str(tmp_path), False)
    ram = tmp_path / "ram" / "job-dcpjob" / "dcp" / "step-00000007"
    assert main(["ckpt", "verify", str(ram.parent)]) == 0
    assert "ok  step 7 (DCP): 2 rank(s)" in capsys.readouterr().out
    victim = next(p for p in ram.iterdir() if p.suffix == ".distcp")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    reader = TieredStorageReader(
        job_id="dcpjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram"
    )
    assert reader.tier == "persistent"
    assert any(victim.name in why and "checksum" in why for _, _, why in reader.refused)
    assert main(["ckpt", "verify", str(ram.parent)]) == 1  # what a user checks by hand says so too
    assert f"BAD step 7 (DCP): {victim}: checksum mismatch" in capsys.readouterr().err
    _spawn(_load_worker, 1, str(tmp_path), "persistent")


def test_no_valid_copy_is_a_clear_error(tmp_path):
    _spawn(_save_worker, 2, str(tmp_path), False)
    for root in (tmp_path / "ram" / "job-dcpjob" / "dcp", tmp_path / "persistent" / "dcp"):
        (mf.step_dir(root, 7) / mf.MANIFEST).write_text('{"format": 1, "job_')  # truncated
    with pytest.raises(mf.CheckpointInvalid, match="manifest unreadable"):
        TieredStorageReader(
            job_id="dcpjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram"
        )
    with pytest.raises(mf.CheckpointInvalid):
        TieredStorageReader(
            job_id="otherjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram"
        )
