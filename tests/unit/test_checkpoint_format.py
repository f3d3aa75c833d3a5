"""Checkpoint files hold data only: a JSON skeleton and raw tensors, in the safetensors format.

What real loops register (Adam's tuple betas, int-keyed optimizer state, ReduceLROnPlateau's
inf, a loader's 64-bit seed, bfloat16 weights) comes back exactly, types included; what a
skeleton cannot hold is refused at the commit with the path to it; any safetensors reader
opens the files; files of the pickle format before are read only when they are plain data,
and refused with one line otherwise, running nothing.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections import OrderedDict, namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from resilience.errors import NotPlainData, RegistrationError
from resilience.state import skeleton as skel
from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers import tier_file

LEGACY = Path(__file__).parent / "fixtures" / "legacy_checkpoints"


def loop_state() -> dict:
    """The kinds of values the survey of real states found (see resilience/state/skeleton.py)."""
    return {
        "model": OrderedDict(
            w=torch.arange(6, dtype=torch.float32).reshape(2, 3), b=torch.tensor([1, 2], dtype=torch.bfloat16)
        ),
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3)}},
            "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None}],
        },
        "plateau": {"best": float("inf"), "mode": "min", "num_bad_epochs": 2},
        "loader": {"_base_seed": 9005760548473548363, "flags": [True, False]},
    }


def odd_state() -> dict:
    """Corners a plain JSON encoder gets wrong."""
    return {
        "floats": [float("-inf"), -0.0, 1.0, 1e-310, 0.1],
        "keys": {("a", 1): 1, None: 2, True: 3, 2.5: 4, "$t": 5, "$T": 6},
        "empty": [{}, [], (), ""],
        "text": "\ud800 é \x00",
        "huge": 2**200,
        "uint": torch.tensor([1, 2**40], dtype=torch.uint64),
        "complex": torch.tensor([1 + 2j], dtype=torch.complex64),
        "nested": ((1, (2,)), [3, (4, [5])]),
    }


def assert_same(a, b) -> None:
    assert type(a) is type(b) or (type(a) is OrderedDict and type(b) is dict), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b)
    else:
        assert a == b


@pytest.mark.parametrize("state", [loop_state, odd_state])
def test_states_come_back_exactly_from_a_snapshot_and_a_file(tmp_path, state):
    snap = snapshot.capture(state(), 5)
    assert_same(state(), snapshot.materialize(snap))
    path = mf.write(tmp_path, "j", 5, 1, 0, {"replicated": snap})
    loaded = mf.load(path, mf.read_manifest(path), verify=True)["replicated"]
    assert loaded.step == 5
    assert_same(state(), snapshot.materialize(loaded))


def test_a_nan_keeps_its_bits():
    nan = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
    back = snapshot.materialize(snapshot.capture({"x": nan}, 1))["x"]
    assert struct.pack(">d", back).hex() == "7ff8000000000123"


@pytest.mark.parametrize(
    ("value", "path", "kind"),
    [
        ({"best": np.float64(0.5)}, "['opt']['best']", "numpy.float64"),
        ([1, {"s": {1, 2}}], "['opt'][1]['s']", "builtins.set"),
        ({"p": namedtuple("P", "a b")(1, 2)}, "['opt']['p']", "P"),
        ({3: torch.float32}, "['opt'][3]", "torch.dtype"),
    ],
)
def test_what_a_skeleton_cannot_hold_is_refused_with_its_path(value, path, kind):
    with pytest.raises(NotPlainData) as caught:
        snapshot.capture({"opt": value}, 1)
    assert isinstance(caught.value, RegistrationError)
    line = str(caught.value)
    assert line.startswith(f"registered state{path} is a ") and kind in line and "\n" not in line


def test_a_skeleton_is_json_and_never_a_pickle():
    data, _, _ = skel.dumps({"betas": (0.9, 0.99)}, [])
    assert data.startswith(b'{"format":2')
    with pytest.raises(ValueError):
        skel.loads(pickle.dumps({"format": 2}))
    for name in ("load", "__class__", "nn", "float32; import os"):
        with pytest.raises(ValueError, match="not a torch dtype"):
            skel.dtype_named(name)


def test_any_safetensors_reader_opens_a_tier_file(tmp_path):
    snap = snapshot.capture(odd_state(), 9)
    path = mf.write(tmp_path, "j", 9, 1, 0, {"replicated": snap})
    with safe_open(path / "replicated.bin", framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert meta["format"] == "sres-snapshot" and meta["step"] == "9"
    assert skel.loads(meta["skeleton"].encode())[0]["huge"] == 2**200
    for name, buf in snap.buffers.items():
        stored = tensors[name] if tensors[name].dtype == buf.dtype else tensors[name].view(buf.dtype)
        assert torch.equal(stored, buf), name


def test_a_tier_file_buffer_starts_aligned_to_its_element(tmp_path):
    snap = snapshot.capture(
        {"a": torch.ones(3, dtype=torch.uint8), "b": torch.ones(5), "c": torch.ones(1).double()}, 1
    )
    path = mf.write(tmp_path, "j", 1, 1, 0, {"replicated": snap})
    data = (path / "replicated.bin").read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert (8 + n) % 64 == 0
    header = json.loads(data[8 : 8 + n])
    for name, entry in header.items():
        if name != "__metadata__":
            assert entry["data_offsets"][0] % skel.dtype_named(name).itemsize == 0, name


def test_an_old_format_checkpoint_of_plain_data_is_restored():
    path = LEGACY / "plain" / "step-00000007" / "rank-00000"
    loaded = mf.load(path, mf.read_manifest(path, "legacy"), verify=True)["replicated"]
    assert loaded.step == 7
    assert_same(loop_state(), snapshot.materialize(loaded))


def test_an_old_format_checkpoint_naming_a_class_is_refused_in_one_line():
    path = LEGACY / "numpy" / "step-00000007" / "rank-00000"
    with pytest.raises(mf.CheckpointInvalid) as caught:
        mf.load(path, mf.read_manifest(path, "legacy"))
    line = str(caught.value)
    assert "\n" not in line and str(path / "replicated.bin") in line
    assert "older sres" in line and "numpy" in line


def test_an_old_format_file_that_would_run_code_runs_nothing(tmp_path):
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(ran), "w"))  # creates the file when called

    header = pickle.dumps({"step": 1, "skeleton": pickle.dumps((Payload(), [])), "sizes": {}, "offsets": {}})
    (tmp_path / "replicated.bin").write_bytes(b"SRESCKP1" + struct.pack("<Q", len(header)) + header)
    with pytest.raises(mf.CheckpointInvalid, match=r"older sres .*names (io|builtins)\.open"):
        tier_file.read(tmp_path / "replicated.bin", copy=False)
    assert not ran.exists()


GOOD_MANIFEST = {
    "format": 1,
    "job_id": "J",
    "step": 3,
    "world_size": 2,
    "rank": 1,
    "files": {"replicated.bin": {"size": 8, "checksum": "0"}},
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("world_size", "Infinity"),
        ("world_size", "NaN"),
        ("world_size", "1e999"),
        ("world_size", "0"),
        ("world_size", "2.5"),
        ("world_size", "true"),
        ("step", "-1"),
        ("rank", "2"),
        ("files", "{}"),
        ("files", '{"replicated.bin": {"size": -8, "checksum": "0"}}'),
        ("created", "Infinity"),
        ("shared", '{"replicated.bin": 7}'),
        ("files", '{"../../../../etc/shadow": {"size": 8, "checksum": "0"}}'),
        ("files", '{"..": {"size": 8, "checksum": "0"}}'),
    ],
)
def test_a_manifest_that_no_run_writes_is_refused_in_one_line(tmp_path, field, value):
    """A manifest decides what a resume loads and what a prune deletes: counts are whole,
    finite and in range, and a checkpoint lists at least one file (an empty one "restored"
    0 bytes and ended an untrained model)."""
    text = json.dumps({**GOOD_MANIFEST, field: "@"}).replace('"@"', value)
    (tmp_path / mf.MANIFEST).write_text(text)
    with pytest.raises(mf.CheckpointInvalid) as refused:
        mf.read_manifest(tmp_path)
    assert len(str(refused.value).splitlines()) == 1 and str(tmp_path) in str(refused.value)
    (tmp_path / mf.MANIFEST).write_text(json.dumps(GOOD_MANIFEST))
    (tmp_path / "replicated.bin").write_bytes(bytes(8))
    assert mf.read_manifest(tmp_path).world_size == 2  # the same manifest, well formed, is read
