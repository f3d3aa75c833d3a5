"""The batch cache's files: one step's batch written as data and mapped back bitwise; a torn or
corrupted file found, removed and refused; a directory of another user never used."""

from __future__ import annotations

import os

import pytest
import torch

from resilience.data import batch_file
from resilience.data.batch_store import BatchStore, batches_dir, check_room, key_of
from resilience.errors import CacheTooSmall, CorruptBatch, NotPrivate, UnsupportedBatch


def a_batch() -> dict:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    return {
        "input_ids": torch.arange(8).reshape(4, 2),
        "x": x,
        "same_x": x,  # the same tensor twice: safetensors refuses shared storage, a copy is kept
        "half": torch.ones(2, dtype=torch.bfloat16),
        "extra": {"names": ["a", "b"], "n": 3, "pair": (1, torch.tensor([True, False]))},
        "none": None,
    }


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def test_a_batch_comes_back_bitwise_with_its_step_and_samples(tmp_path):
    batch = a_batch()
    batch_file.write(tmp_path / "b", 7, batch, [[10, 11], [12, 13]], job="42")
    cached = batch_file.read(tmp_path / "b")
    assert (cached.step, cached.args, cached.job) == (7, [[10, 11], [12, 13]], "42")
    assert equal(cached.batch, batch)
    cached.batch["x"].add_(1)  # the file is mapped copy-on-write: a loop's in-place change is its own
    assert equal(batch_file.read(tmp_path / "b").batch, batch)


def test_a_corrupted_or_torn_file_is_refused(tmp_path):
    batch_file.write(tmp_path / "b", 1, a_batch(), [0])
    data = (tmp_path / "b").read_bytes()
    flipped = bytearray(data)
    flipped[-5] ^= 0x01  # one bit of the last tensor's bytes
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    with pytest.raises(CorruptBatch, match="checksum mismatch"):
        batch_file.read(tmp_path / "flipped")
    (tmp_path / "torn").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptBatch):
        batch_file.read(tmp_path / "torn")


def test_what_only_a_pickle_could_hold_is_refused_by_name(tmp_path):
    with pytest.raises(UnsupportedBatch, match=r"batch\['labels'\]\[1\]: 'object' values cannot be cached"):
        batch_file.write(tmp_path / "b", 1, {"labels": [1, object()]}, [])
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_the_store_keeps_steps_and_forgets_those_outside_its_window(tmp_path):
    store = BatchStore(tmp_path / "batches", "job-1")
    for step in range(6):
        store.put(step, {"x": torch.full((2,), float(step))}, [2 * step, 2 * step + 1])
    assert store.steps() == [0, 1, 2, 3, 4, 5]
    assert [step for step, _ in store.keep(2, 4)] == [0, 1, 5]
    assert store.steps() == [2, 3, 4] and store.get(0, key_of([0, 1])) is None
    cached = store.get(3, key_of([6, 7]))
    assert cached is not None and torch.equal(cached.batch["x"], torch.full((2,), 3.0))
    assert cached.args == [6, 7]
    assert os.stat(tmp_path / "batches").st_mode & 0o777 == 0o700


def test_an_entry_is_named_by_its_samples_whoever_asks(tmp_path):
    """Two worlds, or two ranks, that want the same samples at a step read one entry."""
    assert key_of([[1, 2], [3]]) == key_of([[1, 2], [3]]) != key_of([[1, 2, 3]])
    store = BatchStore(tmp_path / "batches", "j")
    store.put(5, {"x": torch.ones(1)}, [[1, 2], [3]])
    store.put(5, {"x": torch.zeros(1)}, [[4]])
    assert store.entries() == sorted([(5, key_of([[1, 2], [3]])), (5, key_of([[4]]))])


def test_a_corrupt_entry_is_removed_so_that_it_is_made_again(tmp_path):
    store = BatchStore(tmp_path / "batches", "j")
    store.put(4, {"x": torch.ones(16)}, [4])
    path = store.path(4, key_of([4]))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBatch):
        store.get(4, key_of([4]))
    assert store.get(4, key_of([4])) is None and store.steps() == []


def test_an_entry_of_another_job_or_step_is_refused_and_removed(tmp_path):
    theirs = BatchStore(tmp_path / "theirs", "job-A")
    theirs.put(3, {"x": torch.ones(2)}, [7])
    ours = BatchStore(tmp_path / "ours", "job-B")
    os.link(theirs.path(3, key_of([7])), ours.path(3, key_of([7])))  # planted by name
    with pytest.raises(CorruptBatch, match="of job 'job-A'"):
        ours.get(3, key_of([7]))
    assert ours.entries() == []
    ours.put(2, {"x": torch.ones(2)}, [7])
    os.rename(ours.path(2, key_of([7])), ours.path(3, key_of([7])))
    with pytest.raises(CorruptBatch, match="holds step 2"):
        ours.get(3, key_of([7]))


def test_a_link_in_place_of_the_cache_or_an_entry_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "batches").symlink_to(elsewhere)
    with pytest.raises(NotPrivate, match="symbolic link"):
        BatchStore(tmp_path / "batches", "j")
    store = BatchStore(tmp_path / "real", "j")
    batch_file.write(elsewhere / "b", 2, {"x": torch.ones(1)}, [], job="j")
    store.path(2, key_of([])).symlink_to(elsewhere / "b")
    with pytest.raises(CorruptBatch, match="not a regular file"):
        store.get(2, key_of([]))


def test_the_cache_lives_in_the_jobs_ram_dir_on_each_node(tmp_path):
    assert batches_dir("123", "n7", tmp_path) == tmp_path / "job-123" / "node-n7" / "batches"


def test_a_cache_that_cannot_fit_is_refused_with_what_it_needs(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    check_room(tmp_path, 1 << 20, 3)
    with pytest.raises(CacheTooSmall, match=r"needs .* MiB \(12 batches of .* MiB\)"):
        check_room(tmp_path, free // 4 + 1, 12)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a directory to another uid (CI is root)")
def test_a_cache_directory_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "batches"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody's
    with pytest.raises(NotPrivate, match="belongs to uid 65534"):
        BatchStore(theirs, "j")


@pytest.mark.parametrize("job", ["", "j", "job-12345", "x" * 37])
@pytest.mark.parametrize("shape", [(2, 256), (3, 7), (5, 100)])
def test_every_tensor_a_rank_maps_is_aligned_as_one_made_in_the_loop(tmp_path, job, shape):
    """BLAS takes other paths for other alignments: on AVX-512 a linear layer's bits change with
    its input 32 bytes off a 64-byte boundary. The header is padded so that the tensors start on
    one, and a tensor after one of an odd size is copied to an aligned one, bits unchanged."""
    xs = [(torch.randn(*shape), torch.arange(shape[0])) for _ in range(3)]
    batch_file.write(tmp_path / "b", 5, xs, {"indices": [1, 2]}, job)
    header = int.from_bytes((tmp_path / "b").read_bytes()[:8], "little")
    assert (8 + header) % batch_file.ALIGN == 0
    read = batch_file.read(tmp_path / "b").batch
    assert all(t.data_ptr() % batch_file.ALIGN == 0 for pair in read for t in pair)
    assert all(torch.equal(a, b) for pa, pb in zip(xs, read) for a, b in zip(pa, pb))


def test_a_batch_file_removed_while_the_cache_is_measured_counts_as_nothing(tmp_path):
    """The producer drops steps behind the window while a rank adds up what the cache holds."""
    from resilience.data.batch_store import _size

    (tmp_path / "step-000000000001-k.batch").write_bytes(b"x" * 10)
    assert _size(tmp_path / "step-000000000001-k.batch") == 10
    assert _size(tmp_path / "step-000000000002-k.batch") == 0
