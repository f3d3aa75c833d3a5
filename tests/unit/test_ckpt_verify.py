"""``sres ckpt verify`` says "ok" only for a step every rank of which is good, and fails on a
directory that holds nothing to verify: a check that finds nothing must not pass."""

from __future__ import annotations

import shutil

import pytest
import torch

from launcher.cli.parser import main
from resilience.state import snapshot
from resilience.tiers import manifest as mf


def save(root, step: int, world: int = 2, share: bool = False) -> None:
    """Every rank's copy of ``step``; with ``share``, ranks > 0 leave their replicated state to
    rank 0's directory, as data-parallel ranks do in the persistent tier."""
    snap = snapshot.capture({"w": torch.arange(4.0)}, step)
    for rank in range(world):
        shares = {"replicated.bin": 0} if share and rank else None
        mf.write(root, "j", step, world, rank, {"replicated": snap}, share=shares)


def verify(capsys, *args) -> tuple[int, list[str], list[str]]:
    code = main(["ckpt", "verify", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_every_good_step_is_ok(tmp_path, capsys):
    save(tmp_path, 5, share=True)
    save(tmp_path, 10, share=True)
    assert verify(capsys, tmp_path) == (
        0,
        ["ok  step 10: 2 rank(s), every checksum matches", "ok  step 5: 2 rank(s), every checksum matches"],
        [],
    )


def test_a_step_whose_shared_file_is_gone_is_bad_and_never_ok(tmp_path, capsys):
    """Rank 0's directory of step 5 pruned while rank 1's manifest, which names rank 0's
    replicated file, was kept: what a healthy run left behind before pruning was agreed."""
    save(tmp_path, 5, share=True)
    save(tmp_path, 10, share=True)
    shutil.rmtree(mf.rank_dir(tmp_path, 5, 0))
    code, out, err = verify(capsys, tmp_path)
    assert code == 1
    assert out == ["ok  step 10: 2 rank(s), every checksum matches"]
    assert len(err) == 1 and err[0].startswith("BAD step 5 rank 1: ") and "missing" in err[0]


def test_one_bad_rank_makes_its_step_bad(tmp_path, capsys):
    save(tmp_path, 5)
    (mf.rank_dir(tmp_path, 5, 1) / "replicated.bin").write_bytes(b"not a checkpoint")
    code, out, err = verify(capsys, tmp_path)
    assert (code, out) == (1, [])
    assert len(err) == 1 and err[0].startswith("BAD step 5 rank 1: ")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.mkdir(), "no checkpoints in it"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("x")), "no checkpoints in it"),
        (lambda p: None, "no such directory"),
        (lambda p: p.write_text("a file"), "no such directory"),
    ],
)
def test_a_directory_with_nothing_to_verify_fails_in_one_line(tmp_path, capsys, make, says):
    target = tmp_path / "tier"
    make(target)
    code, out, err = verify(capsys, target)
    assert (code, out) == (1, [])
    assert len(err) == 1 and err[0].startswith("sres: error: ") and says in err[0]


def test_a_step_asked_for_that_is_not_there_fails_in_one_line(tmp_path, capsys):
    save(tmp_path, 5)
    code, out, err = verify(capsys, tmp_path, "--step", 6)
    assert (code, out) == (1, [])
    assert err == [f"sres: error: no checkpoint of step 6 in {tmp_path}"]
