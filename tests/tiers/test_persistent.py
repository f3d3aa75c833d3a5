"""The persistent tier: full or read-only directories, flush on demand, resharding, the ckpt CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.observability.events import read_events
from launcher.supervisor import RunConfig, Supervisor
from resilience.tiers import manifest as mf
from resilience.tiers import TierConfig, complete_steps
from tests.support.tier_runs import dump, restored, sres_tiers


def _mount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


@pytest.fixture
def small_mount(tmp_path):
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def _wait_event(events: Path, kind: str, timeout_s: float) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if events.exists():
            found = [e for e in read_events(events) if e["event"] == kind]
            if found:
                return found[0]
        time.sleep(0.2)
    return None


@pytest.mark.parametrize(
    "broken, fixed", [("size=1m", "size=64m"), ("size=64m,ro", "rw")], ids=["full", "read-only"]
)
def test_unusable_persistent_dir_warns_training_goes_on_and_saves_resume(
    tmp_path, ram_root, small_mount, broken, fixed
):
    try:
        _mount(small_mount, broken)
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        pytest.fail(f"cannot mount a tmpfs (tests run as root): {err}", pytrace=False)
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(
            run=sres_tiers(
                tmp_path, ram_root, persistent=small_mount, steps=80, train_args=("--sleep-s", "0.15")
            )
        )
    )
    runner.start()
    warning = _wait_event(tmp_path / "run" / "events.jsonl", "tier-warning", 120)
    _remount(small_mount, fixed)  # space (or write access) returns
    runner.join(300)
    run = result["run"]
    assert run.returncode == 0, dump(run)
    assert warning is not None and warning["tier"] == "persistent", dump(run)
    assert (
        ("No space" in warning["error"])
        if broken.startswith("size=1m")
        else ("Read-only" in warning["error"])
    )
    resumed = run.of("tier-resumed")
    assert resumed and resumed[0]["tier"] == "persistent", dump(run)
    assert run.of("finished")[0]["steps"] == 80
    assert complete_steps(small_mount, "tiers"), "saves resumed once the directory was usable"
    assert not list(small_mount.rglob("*.tmp-*")), "a failed save leaves no debris"


def test_a_full_ram_filesystem_is_a_warning_and_the_run_stays_bitwise(tmp_path, small_mount, tiers_reference):
    """Issue 48, finding 8: any user can fill a shared ``/dev/shm``; a full one ended every rank
    at its start (``ENOSPC`` noting the job's tier settings). Now each RAM-tier save says it
    failed and the run ends with the bits of its undisturbed run."""
    try:
        _mount(small_mount, "size=64k")
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        pytest.fail(f"cannot mount a tmpfs (tests run as root): {err}", pytrace=False)
    _fill(small_mount)
    run = sres_tiers(tmp_path, small_mount, job="reference")
    assert run.returncode == 0, dump(run)
    assert run.digests() == tiers_reference
    warnings = [e for e in run.of("tier-warning") if e["tier"] == "ram"]
    assert warnings and all("No space" in e["error"] for e in warnings), dump(run)


def _fill(path: Path) -> None:
    """Every byte of a filesystem taken, as another user's files would take it."""
    with open(path / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_flush_persistent_now_then_restart_with_another_world_size(tmp_path, ram_root, monkeypatch):
    """The preemption hook: persist the newest commit now; a requeued job on 4 ranks restores it
    (resharding the sharded optimizer from 2 ranks)."""
    monkeypatch.setenv("SRES_RAM_ROOT", str(ram_root))
    persistent = tmp_path / "persistent"
    config = RunConfig(
        command=(
            sys.executable,
            "-m",
            "resilience.examples.train_mlp",
            "--steps",
            "400",
            "--sharded",
            "--sleep-s",
            "0.05",
            "--out",
            str(tmp_path / "first" / "out"),
        ),
        nodes=2,
        log_dir=tmp_path / "first",
        hang_timeout_s=5.0,
        max_restarts=0,
        tiers=TierConfig(job_id="flushjob", persistent_dir=str(persistent), persist_every=0),
    )
    supervisor = Supervisor(config, out=open(tmp_path / "supervisor.log", "w"))
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        probe = supervisor.store.clone()
        deadline = time.monotonic() + 120
        while (probe.progress.step() or -1) < 6:  # the newest commit may be a step behind progress
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        assert not complete_steps(persistent, "flushjob")  # persist_every=0: nothing yet
        started = time.monotonic()
        step = supervisor.flush_persistent(timeout_s=60)
        flush_s = time.monotonic() - started
        assert step is not None and step >= 5, read_events(tmp_path / "first" / "events.jsonl")[-3:]
        assert step in complete_steps(persistent, "flushjob")
        assert flush_s < 30
    finally:  # preempted: every process dies (the ranks with the fork server that forked them)
        for slot in list(supervisor.placement.processes.procs):
            supervisor.placement.kill(slot)
        runner.join(60)
    events = read_events(tmp_path / "first" / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "flushed"] == [step]

    subprocess.run(["rm", "-rf", str(ram_root / "job-flushjob")], check=True)  # requeued onto other nodes
    run = sres_tiers(
        tmp_path,
        ram_root,
        name="second",
        job="flushjob",
        nodes=4,
        persistent=persistent,
        steps=step + 4,
        train_args=("--sharded",),
    )
    assert run.returncode == 0, dump(run)
    event = restored(run)
    assert event["step"] == step and set(event["tiers"].values()) == {"persistent"}, dump(run)
    assert len(event["tiers"]) == 2  # the checkpoint's 2 ranks, resharded onto 4
    assert run.of("finished")[0]["steps"] == step + 4


def test_ckpt_ls_and_verify_name_the_bad_file(tmp_path):
    import torch

    from resilience.state import snapshot

    root = tmp_path / "ckpt"
    for step in (4, 8):
        for rank in range(2):
            snap = snapshot.capture({"w": torch.full((1000,), float(step + rank))}, step)
            mf.write(root, "j", step, 2, rank, {"replicated": snap})
    mf.write(root, "j", 12, 2, 0, {"replicated": snapshot.capture({"w": torch.zeros(10)}, 12)})

    def sres(*args):
        return subprocess.run(
            [sys.executable, "-m", "launcher.cli", "ckpt", *args], capture_output=True, text=True
        )

    ls = sres("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert any(line.split()[:2] == ["8", "2"] and "complete" in line for line in lines)
    assert any(line.split()[0] == "12" and "INCOMPLETE" in line for line in lines)
    assert sres("verify", str(root), "--step", "8").returncode == 0
    victim = mf.rank_dir(root, 8, 1) / "replicated.bin"
    data = bytearray(victim.read_bytes())
    data[-7] ^= 0x01
    victim.write_bytes(bytes(data))
    bad = sres("verify", str(root), "--step", "8")
    assert bad.returncode == 1 and str(victim) in bad.stderr and "checksum mismatch" in bad.stderr
    assert sres("verify", str(root), "--step", "4").returncode == 0
    assert sres("verify", str(root)).returncode == 1
    missing = sres("ls", str(tmp_path / "nope"))
    assert (
        missing.returncode == 1
        and "no such directory" in missing.stderr
        and "Traceback" not in missing.stderr
    )


@pytest.mark.slow  # about 5 minutes: the soak tier (``tests/run.sh -m slow``), not CI's
@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "sharded"])
def test_twenty_healthy_runs_leave_every_step_on_disk_whole(tmp_path, sharded):
    """What a user saw once in six runs: a healthy run whose persistent tier ``sres ckpt verify``
    calls BAD (one rank's part of a step pruned, another's kept)."""
    for i in range(20):
        persistent = tmp_path / f"persistent-{i}"
        run = sres_tiers(
            tmp_path / f"run-{i}",
            tmp_path / "ram",
            job=f"healthy-{i}",
            nodes=2,
            persistent=persistent,
            train_args=("--sharded",) if sharded else (),
        )
        assert run.returncode == 0, dump(run)
        verify = subprocess.run(
            [sys.executable, "-m", "launcher.cli", "ckpt", "verify", str(persistent)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verify.returncode == 0 and "BAD" not in verify.stdout, (
            f"run {i}: {verify.stdout}{verify.stderr}"
        )
