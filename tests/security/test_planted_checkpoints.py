"""Checkpoints in a directory another user can write (a project or scratch directory): what that
user plants or swaps there must never run as the victim, never be loaded, never make the
victim delete its own checkpoints.

Each attack is a real process of the attacker's uid; the victim's own checkpoints are what it
loads, bit for bit, or it refuses in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from resilience.tiers import manifest as mf
from tests.security.conftest import JOB, marker, victim_run

pytestmark = pytest.mark.usefixtures("no_ram_roots")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write, without the sticky bit (a project's shared space)."""
    path = Path(tempfile.mkdtemp(prefix="sres-project-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


SAVE_THEN_LOAD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    import torch.distributed.checkpoint as dcp
    from resilience.tiers import manifest as mf
    from resilience.tiers.dcp import TieredStorageReader, TieredStorageWriter

    root, job, started, loads = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    saved = {"w": torch.arange(4096, dtype=torch.float32)}
    dcp.save(saved, storage_writer=TieredStorageWriter(4, job_id=job, persistent_dir=root, ram=False))
    started.write_text("saved")  # the attacker starts swapping now
    outcomes = {}
    for _ in range(loads):
        state = {"w": torch.zeros(4096)}
        try:
            dcp.load(state, storage_reader=TieredStorageReader(job_id=job, persistent_dir=root, ram=False))
            how = "exact" if torch.equal(state["w"], saved["w"]) else "other"
        except mf.CheckpointInvalid as err:
            how = "refused" if len(str(err).splitlines()) == 1 else "refused, several lines"
        except Exception as err:
            how = f"{type(err).__name__}: {err}"
        outcomes[how] = outcomes.get(how, 0) + 1
    print(json.dumps(outcomes))
    """
)

SWAP = textwrap.dedent(
    """
    import os, pickle, sys, time
    from pathlib import Path

    root, marker, started, stop = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = root / "evil" / "step-00000004"
    evil.mkdir(parents=True)
    (evil / ".metadata").write_bytes(pickle.dumps(Payload()))  # DCP's metadata is a pickle
    while not started.exists():
        time.sleep(0.01)
    swaps = 0
    while not stop.exists():
        try:  # the victim's directory aside, the attacker's in its place, and back
            os.rename(root / "dcp", root / "victims")
            os.rename(root / "evil", root / "dcp")
            time.sleep(0.0005)
            os.rename(root / "dcp", root / "evil")
            os.rename(root / "victims", root / "dcp")
            swaps += 1
        except OSError as err:
            print("swap failed:", err)
            break
        time.sleep(0.001)
    print(swaps)
    """
)


def test_a_dcp_directory_swapped_between_the_check_and_the_load_runs_nothing(victim, attacker, shared):
    """Finding 1: the reader checked a step directory by its path, and torch reopened
    ``.metadata`` by path and unpickled it; the attacker renamed the victim's directory aside
    and its own in place in between (3 of 6 resumes ran the attacker's code). Every load now
    reads the directory it checked, through a held descriptor."""
    started, stop = shared / "started", shared / "stop"
    swapper = attacker.popen(
        [
            sys.executable,
            "-c",
            SWAP,
            str(shared),
            str(marker(victim)),
            str(started),
            str(stop),
        ]
    )
    try:
        out = victim.python(SAVE_THEN_LOAD, str(shared), JOB, str(started), "60", timeout=240)
    finally:
        stop.touch()
        swaps, swap_err = swapper.communicate(timeout=30)

    assert out.returncode == 0, out.stderr
    assert not marker(victim).exists(), "the attacker's pickle ran as the victim"
    outcomes = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(outcomes) <= {"exact", "refused"}, outcomes  # the victim's state, or one line
    assert outcomes.get("exact", 0) >= 1, outcomes
    assert swaps.strip().isdigit() and int(swaps) > 10, (swaps, swap_err)  # the attack was on


PLANT_MANIFESTS = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    root, job = Path(sys.argv[1]), sys.argv[2]
    for step in (99999990, 99999991):
        for rank in (0, 1):
            where = root / f"step-{step:08d}" / f"rank-{rank:05d}"
            where.mkdir(parents=True)
            manifest = {"format": 1, "job_id": job, "step": step, "world_size": 2, "rank": rank, "files": {}}
            (where / "manifest.json").write_text(json.dumps(manifest))
        os.chmod(root / f"step-{step:08d}", 0o777)
    print("planted")
    """
)


def test_manifests_another_user_planted_are_neither_loaded_nor_make_the_prune_delete(
    victim, attacker, victim_reference, shared
):
    """Finding 2: manifests alone (``"files": {}``) for newer steps made the victim's resume
    "restore" an empty checkpoint and its prune delete every real step. A manifest counts only
    when the user wrote it: the run trains from scratch to the reference's bits, and its own
    newest steps stay on disk, readable by no one else (finding 8: they followed the umask)."""
    planted = attacker.python(PLANT_MANIFESTS, str(shared), JOB)
    assert planted.returncode == 0, planted.stderr

    run = victim_run(victim, name="planted-manifests", persistent=shared)

    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert all(e["step"] < 99999990 for e in run.of("restored")), run.of("restored")  # not the attacker's
    own = [s for s in mf.steps_in(shared) if s < 99999990]
    assert own and max(own) >= 8, own  # the prune kept the victim's newest complete steps
    # Private by default at the victim's umask (022): no other user reads a step of the run.
    assert all(mf.step_dir(shared, s).stat().st_mode & 0o077 == 0 for s in own), own
    newest = mf.step_dir(shared, max(own))
    peek = attacker.python("import os, sys; print(os.listdir(sys.argv[1]))", str(newest))
    assert peek.returncode != 0 and "PermissionError" in peek.stderr, peek.stdout


FORGED = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    root = Path(sys.argv[1])
    fields = {"format": 1, "job_id": "J", "step": 3, "world_size": 2, "rank": 0,
              "files": {"replicated.bin": {"size": 8, "checksum": "0"}}}
    for name, value in [("infinite", "Infinity"), ("huge", "1e999"), ("negative", "-3")]:
        d = root / name
        d.mkdir()
        text = json.dumps(fields).replace('"world_size": 2', f'"world_size": {value}')
        (d / "manifest.json").write_text(text)
    os.mkfifo(root / "fifo-manifest.json")
    print("forged")
    """
)

READ_ALL = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from resilience.tiers import manifest as mf

    root = Path(sys.argv[1])
    out = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            mf.read_manifest(path)
            out[path.name] = "read"
        except mf.CheckpointInvalid as err:
            out[path.name] = str(err)
    try:
        mf.read_manifest(root, name="fifo-manifest.json")
        out["fifo"] = "read"
    except mf.CheckpointInvalid as err:
        out["fifo"] = str(err)
    print(json.dumps(out))
    """
)


def test_a_manifest_of_another_users_or_a_fifo_is_refused_in_one_line_without_waiting(
    victim, attacker, shared
):
    """Manifests the attacker wrote (non-finite and negative counts among them) and a FIFO
    under a manifest's name: each is refused with one line naming the file, none hangs."""
    forged = attacker.python(FORGED, str(shared))
    assert forged.returncode == 0, forged.stderr
    out = victim.python(READ_ALL, str(shared), timeout=30)
    assert out.returncode == 0, out.stderr
    verdicts = json.loads(out.stdout)
    assert set(verdicts) == {"infinite", "huge", "negative", "fifo"}, verdicts
    for name, why in verdicts.items():
        assert why != "read" and len(why.splitlines()) == 1, (name, why)
        assert f"written by uid {attacker.uid}, not by this user" in why or "not a regular file" in why, why
