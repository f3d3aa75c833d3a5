"""Checksums that see what a sum does not: swapped, zeroed and shifted data.

Each corruption below leaves a wrapping sum of the words unchanged (asserted, so the test
keeps meaning something); the xxHash checksum of every checkpoint file and transfer refuses it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers import tier_file

PAGE = 4096
N = 4 * PAGE  # float32 elements


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(N, generator=g)
    # A page of +x/-x word pairs: its int32 words sum to 0, so zeroing it keeps any sum.
    pairs = torch.randint(1, 2**30, (PAGE // 8,), generator=g, dtype=torch.int32)
    weights.view(torch.int32)[PAGE // 4 : PAGE // 4 + PAGE // 4] = torch.stack([pairs, -pairs], 1).reshape(-1)
    return {"model": {"w": weights, "b": torch.arange(7, dtype=torch.float32)}}


def swap_blocks(data: np.ndarray, start: int) -> None:
    a, b = start, start + PAGE  # two float32 elements 4 KiB apart
    data[a : a + 4], data[b : b + 4] = data[b : b + 4].copy(), data[a : a + 4].copy()


def zero_page(data: np.ndarray, start: int) -> None:
    data[start + PAGE : start + 2 * PAGE] = 0  # the page of +x/-x pairs


def shift_one(data: np.ndarray, start: int) -> None:
    region = data[start : start + N * 4].view(np.float32)
    region[:] = np.roll(region.copy(), 1)


@pytest.mark.parametrize("corrupt", [swap_blocks, zero_page, shift_one])
@pytest.mark.local  # spawns: python -m launcher.cli ckpt verify
def test_corruption_a_sum_misses_is_refused(tmp_path, corrupt):
    snaps = {"replicated": snapshot.capture(state(), 3)}
    path = mf.write(tmp_path, "j1", 3, 1, 0, snaps)
    manifest = mf.read_manifest(path)
    file = path / "replicated.bin"
    loaded = mf.load(path, manifest, copy=True)["replicated"]
    start = _offset_of_weights(file, loaded)
    data = np.fromfile(file, dtype=np.uint8)
    before = snapshot.sum_checksum(
        b"", [torch.from_numpy(data[start : start + N * 4].copy()).view(torch.int32)]
    )
    corrupt(data, start)
    after = snapshot.sum_checksum(
        b"", [torch.from_numpy(data[start : start + N * 4].copy()).view(torch.int32)]
    )
    assert before == after, "the corruption should be one a sum cannot see"
    data.tofile(file)
    with pytest.raises(mf.CheckpointInvalid, match="replicated.bin: checksum mismatch"):
        mf.load(path, mf.read_manifest(path))
    verify = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "ckpt", "verify", str(tmp_path), "--step", "3"],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 1 and "replicated.bin" in verify.stdout + verify.stderr


def _offset_of_weights(file, snap: snapshot.Snapshot) -> int:
    """Byte offset of the float32 weights in the checkpoint file."""
    data = np.fromfile(file, dtype=np.uint8)
    needle = snapshot.materialize(snap)["model"]["w"][:64].numpy().tobytes()
    offset = data.tobytes().find(needle)
    assert offset >= 0
    return offset


def test_transfers_agree_however_the_bytes_are_cut():
    snap = snapshot.capture(state(), 1)
    skeleton, tensors, _ = snapshot.describe(state())
    assert snapshot.checksum(snap.skeleton, snap.regions()) == snapshot.checksum(skeleton, tensors)
    assert (
        snapshot.checksum(snap.skeleton, [snap.buffers[k] for k in sorted(snap.buffers)]) == snap.checksum()
    )


def test_manifests_of_the_sum_checksum_stay_readable(tmp_path):
    """A checkpoint written before xxHash (8 hex digits, a sum) still loads, and still
    refuses what a sum sees (a flipped byte)."""
    snaps = {"replicated": snapshot.capture(state(), 2)}
    path = mf.write(tmp_path, "j1", 2, 1, 0, snaps)
    data = json.loads((path / mf.MANIFEST).read_text())
    snap, header, buffers = tier_file.read(path / "replicated.bin", copy=True)
    data["files"]["replicated.bin"]["checksum"] = snapshot.sum_checksum(header, buffers)
    (path / mf.MANIFEST).write_text(json.dumps(data))
    assert mf.load(path, mf.read_manifest(path))["replicated"].digest() == snaps["replicated"].digest()
    raw = np.fromfile(path / "replicated.bin", dtype=np.uint8)
    raw[-3] ^= 0xFF
    raw.tofile(path / "replicated.bin")
    with pytest.raises(mf.CheckpointInvalid, match="checksum mismatch"):
        mf.load(path, mf.read_manifest(path))
