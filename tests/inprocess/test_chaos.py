"""``sres chaos`` on the example MLP, tiers on, data-parallel and sharded: seeded random faults of
every kind (12 in CI, with seeds that draw every kind; 25 under ``-m slow``), every one recovered,
the final state of every rank identical to the fault-free run's, and nothing of either run left
behind.

The persistent tier lives on a 64 MiB tmpfs mounted for the test, so that ``fill-disk``
really fills a filesystem (ENOSPC) without touching the machine's disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.goodput_checks import assert_account_adds_up

KINDS = (
    "kill,raise,hang,kill-during-commit,node,kill-all,corrupt-ram,kill-during-transfer,fill-disk,"
    "kill-supervisor-child"
)


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "persistent"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        why = f"a full disk needs a small filesystem: mount -t tmpfs failed (needs root): {mounted.stderr}"
        pytest.skip(reason=why)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.mark.parametrize(
    "sharded, faults, seed",
    [
        pytest.param(False, 12, 2, id="ddp"),  # seeds whose 12 faults draw every kind
        pytest.param(True, 12, 151, id="sharded"),
        pytest.param(False, 25, 7, id="ddp-soak", marks=pytest.mark.slow),
        pytest.param(True, 25, 7, id="sharded-soak", marks=pytest.mark.slow),
    ],
)
def test_sres_chaos_random_faults_identical_and_clean(tmp_path, small_disk, sharded, faults, seed):
    kinds = KINDS + (",kill-during-copy" if sharded else "")
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "chaos",
        "--faults",
        str(faults),
        "--seed",
        str(seed),
        "--every",
        "4",
        "--kinds",
        kinds,
        "--log-dir",
        str(tmp_path),
        "--",
        "--nodes",
        "4",
        "--spares",
        "1",
        "--hang-timeout",
        "3",
        "--reform-timeout",
        "20",
        "--persistent-dir",
        str(small_disk),
        "--persist-every",
        "4",
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--steps",
        "100",
        "--progress-every",
        "1000",
        *(("--sharded",) if sharded else ()),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
    # Its own session, so that a stuck run is stopped whole (the supervisor with it), under
    # pytest-timeout's 300 s, and shows where it stuck.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=270)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"sres chaos stuck after 270 s:\n{_tail(out)}\n{_tail(err)}\n" + _events_tail(tmp_path))
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "identical              yes" in done.stdout and "clean                  yes" in done.stdout, (
        done.stdout
    )
    schedule = json.loads((tmp_path / "chaos" / "fault-schedule.json").read_text())["injections"]
    # The seed draws every kind; a paired kind brings its partner (free-disk after fill-disk).
    assert len({s for s in schedule if not s.startswith("free-disk")}) >= faults
    assert {s.split(":")[0] for s in schedule} == set(kinds.split(",")) | {"free-disk"}
    events = [json.loads(line) for line in (tmp_path / "chaos" / "events.jsonl").read_text().splitlines()]
    assert (
        len([e for e in events if e["event"] == "fault"]) >= faults
    )  # a whole-node or all-rank one counts per rank
    full = [e for e in events if e["event"] == "tier-warning" and e["tier"] == "persistent"]
    assert any("No space left" in e["error"] for e in full), "fill-disk never reached a persistent save"
    assert not list(small_disk.rglob(".sres-fill-disk-*"))
    assert [e for e in events if e["event"] == "spare-lost"], "kill-supervisor-child never killed a spare"
    for run in ("reference", "chaos"):  # the goodput account adds up, with faults or without
        assert_account_adds_up(tmp_path / run)


def _tail(out: bytes | str | None, chars: int = 6000) -> str:
    text = out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
    return text[-chars:]


def _events_tail(log_dir, lines: int = 60) -> str:
    shown = []
    for events in sorted(log_dir.glob("*/events.jsonl")):
        shown.append(f"--- {events}")
        shown.extend(events.read_text(errors="replace").splitlines()[-lines:])
    return "\n".join(shown)
