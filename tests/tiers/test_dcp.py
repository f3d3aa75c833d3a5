"""DCP save/load through TieredStorageWriter/TieredStorageReader, with real gloo process groups."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from resilience import manifest as mf
from resilience.tiers import TieredStorageReader, TieredStorageWriter

ROWS, COLS = 12, 5


def _full() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_worker(rank: int, world: int, port: int, tmp: str, asynchronous: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        state = {"weight": distribute_tensor(_full(), mesh, [Shard(0)]), "step": torch.tensor(7)}
        writer = TieredStorageWriter(7, job_id="dcpjob", persistent_dir=f"{tmp}/persistent", ram_root=Path(tmp) / "ram")
        if asynchronous:
            dcp.async_save(state, storage_writer=writer).result()
        else:
            dcp.save(state, storage_writer=writer)
        dist.barrier()  # no rank leaves (rank 0 hosts the store) while another still talks to it
    finally:
        dist.destroy_process_group()


def _load_worker(rank: int, world: int, port: int, tmp: str, expect_tier: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        state = {"weight": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]), "step": torch.tensor(0)}
        reader = TieredStorageReader(job_id="dcpjob", persistent_dir=f"{tmp}/persistent", ram_root=Path(tmp) / "ram")
        assert reader.tier == expect_tier, (reader.tier, reader.refused)
        dcp.load(state, storage_reader=reader)
        assert torch.equal(state["weight"].full_tensor(), _full())
        assert int(state["step"]) == 7
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(fn, world: int, *args) -> None:
    mp.start_processes(fn, args=(world, _port(), *args), nprocs=world, join=True, start_method="spawn")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["save", "async_save"])
def test_round_trip_and_load_on_another_world_size(tmp_path, asynchronous):
    _spawn(_save_worker, 2, str(tmp_path), asynchronous)
    ram = tmp_path / "ram" / "job-dcpjob" / "dcp" / "step-00000007"
    assert (ram / mf.MANIFEST).exists() and (tmp_path / "persistent" / "dcp" / "step-00000007" / mf.MANIFEST).exists()
    _spawn(_load_worker, 2, str(tmp_path), "ram")  # same world size, RAM tier
    _spawn(_load_worker, 3, str(tmp_path), "ram")  # resharded by DCP onto 3 ranks


def test_corrupt_ram_copy_falls_back_to_persistent_and_says_why(tmp_path):
    _spawn(_save_worker, 2, str(tmp_path), False)
    ram = tmp_path / "ram" / "job-dcpjob" / "dcp" / "step-00000007"
    victim = next(p for p in ram.iterdir() if p.suffix == ".distcp")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    reader = TieredStorageReader(job_id="dcpjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram")
    assert reader.tier == "persistent"
    assert any(victim.name in why and "checksum" in why for _, _, why in reader.refused)
    _spawn(_load_worker, 1, str(tmp_path), "persistent")


def test_no_valid_copy_is_a_clear_error(tmp_path):
    _spawn(_save_worker, 2, str(tmp_path), False)
    for root in (tmp_path / "ram" / "job-dcpjob" / "dcp", tmp_path / "persistent" / "dcp"):
        (mf.step_dir(root, 7) / mf.MANIFEST).write_text('{"format": 1, "job_')  # truncated
    with pytest.raises(mf.CheckpointInvalid, match="manifest unreadable"):
        TieredStorageReader(job_id="dcpjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram")
    with pytest.raises(mf.CheckpointInvalid):
        TieredStorageReader(job_id="otherjob", persistent_dir=tmp_path / "persistent", ram_root=tmp_path / "ram")
