"""Files on a shared node: another user plants the victim's RAM root with a checkpoint that runs
code when unpickled, and reads whatever of the victim's run it can reach.

Each attack is made by a real process of the attacker's uid; the victim's run must end with
the bits of its fault-free run and the payload must never run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.security.conftest import JOB, marker, ram_roots, victim_run
from tests.support.sres_runs import when_event

pytestmark = pytest.mark.usefixtures("no_ram_roots")

PLANT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from tests.support.attacker import pickled_checkpoint

    root, job, marker, victim_uid = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    class Payload:
        def __reduce__(self):
            return (os.system, (f"test $(id -u) = {victim_uid} && touch {marker}",))

    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)  # "helpfully" open to all: the victim must still not adopt it
    for node in (0, 1):
        for rank in (0, 1):
            own = root / f"job-{job}" / f"node-{node}" / "own"
            pickled_checkpoint(own, job, 99999999, 2, rank, Payload())
    print("planted", root)
    """
)


def test_a_ram_root_planted_by_another_user_is_never_used(victim, attacker, victim_reference):
    """The attacker creates the victim's default RAM root first, with a newer step of the next
    job in it whose state runs the attacker's code when unpickled. The victim's run says so in
    one warning line, keeps its RAM tier in a private place of its own, and ends exactly."""
    planted = Path(f"/dev/shm/sres-{victim.uid}")
    done = attacker.python(PLANT, str(planted), JOB, str(marker(victim)), str(victim.uid))
    assert done.returncode == 0, done.stderr
    before = sorted(str(p) for p in planted.rglob("*"))

    run = victim_run(victim, name="planted")

    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert not marker(victim).exists(), "the planted checkpoint was unpickled"
    assert not run.of("restored"), run.events  # nothing was restored from the planted step
    assert f"{planted} belongs to uid {attacker.uid}" in run.stderr
    assert "a private place" in run.stderr
    assert sorted(str(p) for p in planted.rglob("*")) == before  # not read into, not written
    assert planted.stat().st_uid == attacker.uid
    # The supervisor cleaned the finished run's RAM tier where its ranks had kept it (it once
    # worked out a fallback of its own and left 228 KiB of model state in theirs).
    (fallback,) = [Path(p) for p in ram_roots(victim) if p != str(planted)]
    assert not list(fallback.glob("job-*")), list(fallback.rglob("*"))


def test_a_link_where_the_ram_root_should_be_is_never_followed(victim, attacker, victim_reference, tmp_path):
    trap = attacker.home / "trap"
    done = attacker.python(
        f"import os; os.mkdir({str(trap)!r}, 0o777); os.chmod({str(trap)!r}, 0o777); "
        f"os.symlink({str(trap)!r}, '/dev/shm/sres-{victim.uid}')"
    )
    assert done.returncode == 0, done.stderr
    run = victim_run(victim, name="linked")
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert "is a symbolic link" in run.stderr
    assert list(trap.iterdir()) == []  # nothing of the victim's went through the link


READ = textwrap.dedent(
    """
    import json, os, sys
    tried = {}
    for path in sys.argv[1:]:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                open(path, "rb").read(1)
            tried[path] = "read"
        except OSError as err:
            tried[path] = type(err).__name__
    print(json.dumps(tried))
    """
)


def test_another_user_reads_nothing_of_a_running_job(victim, attacker, victim_reference):
    """While the victim's run holds checkpoints in RAM, the attacker tries its RAM root, a
    checkpoint file, its log dir and events (the command line), and a rank's output."""
    log_dir = victim.home / "reads"
    tried: dict[str, str] = {}

    def read_all() -> None:
        (root,) = ram_roots(victim)
        targets = [
            root,
            *(str(p) for p in Path(root).rglob("*.bin")),
            str(log_dir),
            str(log_dir / "events.jsonl"),
            str(log_dir / "control.token"),
            *(str(p) for p in (log_dir / "ranks").glob("*.log")),
        ]
        out = attacker.python(READ, *targets)
        tried.update(json.loads(out.stdout))

    watcher = when_event(log_dir, lambda e: e["event"] == "checkpoint-saved", read_all)
    run = victim_run(victim, name="reads", train_args=("--sleep-s", "0.3"))
    watcher.join(timeout=30)
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert len(tried) >= 5, tried  # the root, a checkpoint file at least, the log dir and its files
    assert set(tried.values()) == {"PermissionError"}, tried
    assert os.stat(log_dir).st_mode & 0o777 == 0o700


PUSH = textwrap.dedent(
    """
    import json, os, socket, sys, tempfile
    from pathlib import Path
    from resilience.contract import run_secret
    from resilience.tiers import manifest as mf
    from resilience.tiers.transport import NeighbourLink, push_checkpoint
    from tests.support.attacker import greeting, pickled_checkpoint

    victim_uid, job, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]

    class Payload:
        def __reduce__(self):
            return (os.system, (f"test $(id -u) = {victim_uid} && touch {marker}",))

    found = [f"{host}:{port}" for host, port in greeting(victim_uid, b"sres-neighbour")]
    results = {}
    src = Path(tempfile.mkdtemp())
    for rank in (0, 1):
        pickled_checkpoint(src, job, 99999999, 2, rank, Payload())
    for address in found:
        for rank in (0, 1):
            try:  # the protocol, with a guessed secret
                guess = NeighbourLink(address, run_secret.new_secret())
                push_checkpoint(guess, mf.rank_dir(src, 99999999, rank), job, rank, 99999999)
                results[f"{address}/{rank}"] = "accepted"
            except (OSError, ValueError) as err:  # a refusal: no "ok", or cut off mid-send
                results[f"{address}/{rank}"] = "refused" if isinstance(err, ConnectionError) else repr(err)
    print(json.dumps({"found": found, "results": results}))
    """
)


def test_a_forged_neighbour_push_is_refused_and_a_restore_after_it_is_exact(
    victim, attacker, victim_reference
):
    """The attacker finds the victim's neighbour-copy ports (``/proc/net/tcp``, then the
    greeting) and pushes a newer step whose state runs its code; then every rank of the victim
    is killed and the run restores from its tiers."""
    log_dir = victim.home / "pushed"
    outcome: dict = {}

    def push() -> None:
        out = attacker.python(PUSH, str(victim.uid), JOB, str(marker(victim)))
        outcome.update(json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr})

    watcher = when_event(log_dir, lambda e: e["event"] == "checkpoint-saved", push)  # servers up
    # 2 s a step: room for the attacker's scan (torch's import, a probe of each port) before the
    # kill, on a loaded machine too
    run = victim_run(victim, "--inject", "kill-all:step=11", name="pushed", train_args=("--sleep-s", "2.0"))
    watcher.join(timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.digests() == victim_reference
    assert len(outcome.get("found", [])) >= 2, outcome  # both nodes' servers were found
    assert set(outcome["results"].values()) == {"refused"}, outcome
    assert not marker(victim).exists(), "a forged copy was unpickled"
    (restored,) = run.of("restored")
    assert restored["step"] < 11, restored


PLANT_DCP = textwrap.dedent(
    """
    import json, os, pickle, sys, time
    from pathlib import Path
    from resilience.tiers import manifest as mf

    step_dir, job, marker = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    step_dir.mkdir(parents=True)
    (step_dir / ".metadata").write_bytes(pickle.dumps(Payload()))  # DCP's metadata is a pickle
    from resilience.tiers.dcp import file_entry
    files = {".metadata": file_entry(step_dir / ".metadata")}
    mf.write_manifest(step_dir, mf.Manifest(job, 99999999, 1, -1, files, created=time.time()))
    mf.write_manifest(step_dir, mf.Manifest(job, 99999999, 1, 0, {}), "manifest-rank-00000.json")
    """
)

LOAD_DCP = textwrap.dedent(
    """
    import sys
    from resilience.tiers import manifest as mf
    from resilience.tiers.dcp import TieredStorageReader

    try:
        TieredStorageReader(job_id=sys.argv[2], persistent_dir=sys.argv[1], ram=False)
    except mf.CheckpointInvalid as err:
        print(err)
    """
)


def test_a_dcp_checkpoint_another_user_wrote_in_a_shared_directory_is_not_read(victim, attacker):
    """A project directory open to all: the attacker writes a newer DCP step for the victim's
    job, its ``.metadata`` a pickle that runs code. The victim's reader refuses it in one line
    before torch's reader could unpickle it."""
    shared = Path(tempfile.mkdtemp(prefix="sres-project-"))
    os.chmod(shared, 0o777)
    planted = attacker.python(PLANT_DCP, str(shared / "dcp" / "step-99999999"), JOB, str(marker(victim)))
    assert planted.returncode == 0, planted.stderr

    try:
        out = victim.python(LOAD_DCP, str(shared), JOB)
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    assert out.returncode == 0, out.stderr
    assert f"written by uid {attacker.uid}, not by this user" in out.stdout, out.stdout
    assert len(out.stdout.strip().splitlines()) == 1
    assert not marker(victim).exists(), "the planted DCP metadata was unpickled"


def test_a_log_dir_below_a_directory_the_attacker_controls_is_refused_in_one_line(victim, attacker):
    """Finding 8: only the log dir itself was checked; from a directory above it that they
    controlled, another user swapped the run dir for a link and appended 90 lines to one of the
    victim's own files through it. Such a log dir is refused before anything is written."""
    shared = Path(tempfile.mkdtemp(prefix="sres-scratch-"))
    os.chmod(shared, 0o1777)  # a scratch space as /tmp is: anyone creates, no one renames another's
    try:
        made = attacker.python(
            "import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777)",
            str(shared / "project"),
        )
        assert made.returncode == 0, made.stderr
        sres = str(Path(sys.executable).parent / "sres")
        log_dir = shared / "project" / "run"
        argv = [sres, "run", "--nodes", "1", "--launcher", "local", "--log-dir", str(log_dir), "--", "true"]
        done = victim.run(argv)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("sres: error: log dir: ") and f"belongs to uid {attacker.uid}" in line, line
