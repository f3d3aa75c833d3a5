"""Root's epilog against a RAM tier its job's user controls (``sres hooks epilog`` as slurmd
runs it, as root): a node directory swapped for a link to root's files and to the user's own
files elsewhere, a step swapped for a link, a FIFO named ``manifest.json``. Nothing outside the
tree is touched, nothing blocks, and the step a restore needs stays. Also the time limit:
cleanup work that never ends is stopped."""

from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys
import time

import pytest
import yaml

from launcher.errors import PrivilegeError
from launcher.privileges import call_as
from tests.support.users import REPO

JOB = "4242"


def _manifest(step: int, rank: int, world: int = 1) -> str:
    from resilience.tiers.checkpoint_dirs import FileEntry, Manifest

    return Manifest(JOB, step, world, rank, {"replicated.bin": FileEntry(8, "0")}).to_json()


def _write_step(own, step: int) -> None:
    rank = own / f"step-{step:08d}" / "rank-00000"
    rank.mkdir(parents=True)
    (rank / "replicated.bin").write_bytes(b"12345678")
    (rank / "manifest.json").write_text(_manifest(step, 0))


def _chown_tree(top, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, gid)
    os.lchown(top, uid, gid)


def test_the_epilog_as_root_touches_nothing_outside_a_users_tree(victim, tmp_path):
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    (root_only / "precious").write_text("root's")
    elsewhere = victim.home / "elsewhere"  # the user's own files, not the job's
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / "data").write_text("the user's")
    ram = victim.home / f"ram-{victim.uid}"
    job = ram / f"job-{JOB}"
    own = job / "node-n1" / "own"
    for step in (3, 4, 5):
        _write_step(own, step)
    fifo_rank = own / "step-00000006" / "rank-00000"
    fifo_rank.mkdir(parents=True)
    os.mkfifo(fifo_rank / "manifest.json")
    (own / "step-00000002").symlink_to(elsewhere)
    (job / "node-n2").symlink_to(root_only)
    (job / "node-n3").mkdir()
    (job / "node-n3" / "own").symlink_to(elsewhere)
    ram.chmod(0o700)
    _chown_tree(ram, victim.uid, victim.gid)
    log = tmp_path / "health.jsonl"
    config = tmp_path / "health.yaml"
    off = {"enabled": False}
    config.write_text(
        yaml.safe_dump(
            {
                "ram_root": str(victim.home / "ram-{uid}"),
                "log": {"file": str(log), "syslog": False},
                "budget": {"cleanup_s": 20},
                "checks": {"gpu": off, "processes": off, "slurmctld": off},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRES_"))}
    env.update(
        SLURMD_NODENAME="n1",
        SLURM_JOB_ID=JOB,
        SLURM_NODELIST="n1",
        SLURM_JOB_UID=str(victim.uid),
        SLURM_SCRIPT_CONTEXT="epilog_slurmd",
        PYTHONPATH=str(REPO),
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "launcher.entry", "hooks", "epilog", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert time.monotonic() - started < 30
    cleanup = [json.loads(line) for line in log.read_text().splitlines() if '"cleanup"' in line]
    assert [c["status"] for c in cleanup] == ["ok"], cleanup
    assert (root_only / "precious").read_text() == "root's"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data"]
    assert (elsewhere / "data").read_text() == "the user's"
    assert not os.path.lexists(job / "node-n2") and not os.path.lexists(own / "step-00000002")
    assert sorted(p.name for p in own.iterdir()) == ["step-00000004", "step-00000005"]


def test_cleanup_work_that_never_ends_is_stopped_at_its_limit(victim):
    started = time.monotonic()
    with pytest.raises(PrivilegeError, match="no answer within 1 s"):
        call_as(victim.uid, lambda: time.sleep(60), timeout_s=1)
    assert time.monotonic() - started < 10
    with pytest.raises(PrivilegeError, match="no answer within 1 s"):
        call_as(0, lambda: time.sleep(60), timeout_s=1)  # root's own job: a child all the same
    assert call_as(victim.uid, os.getuid, timeout_s=5) == victim.uid


def test_root_verifies_a_users_checkpoints_as_that_user(victim, attacker):
    """``sres ckpt verify`` by root (an admin) on a user's directory reads the user's own files
    as theirs, and refuses one of another uid as a run would (never reading it as root)."""
    ckpt = victim.home / "ckpt-verified-by-root"
    shutil.rmtree(ckpt, ignore_errors=True)
    write = (
        "import sys, torch\n"
        "from resilience.state import snapshot\n"
        "from resilience.tiers import manifest as mf\n"
        "for rank in (0, 1):\n"
        "    snap = snapshot.capture({'w': torch.full((64,), float(rank))}, 8)\n"
        "    mf.write(sys.argv[1], 'j', 8, 2, rank, {'replicated': snap})\n"
    )
    made = victim.python(write, str(ckpt))
    assert made.returncode == 0, made.stderr
    verify = [sys.executable, "-m", "launcher.cli", "ckpt", "verify", str(ckpt)]
    ok = subprocess.run(verify, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "ok  step 8: 2 rank(s)" in ok.stdout, ok.stdout + ok.stderr
    planted = ckpt / "step-00000008" / "rank-00001" / "replicated.bin"
    data = planted.read_bytes()
    planted.unlink()
    planted.write_bytes(data)  # the same bytes, now another user's file
    os.chown(planted, attacker.uid, attacker.gid)
    bad = subprocess.run(verify, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and f"written by uid {attacker.uid}" in bad.stderr, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr
