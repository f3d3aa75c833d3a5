"""``sres governance apply`` against a real accounting database: slurmdbd on MariaDB, started by
the test (tests/support/accounting.py), and a slurmctld that enforces what it holds.

What an admin checks: after an apply, ``sacctmgr`` lists the teams' accounts and the classes'
QOS as the policy says, and Slurm enforces them (a job over its team's quota waits on the
team's limit); a second apply changes nothing; a dry run changes nothing; an invalid policy is
refused in one line and changes nothing; a change Slurm refuses part way is undone.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.governance import policy as gp
from launcher.governance.apply import apply, read_managed
from launcher.governance.report import PLOTS
from launcher.governance.slurm_objects import conf_lines, desired
from launcher.slurm.accounting import Accounting
from launcher.slurm.client import SlurmClient
from launcher.slurm.command_driver import CommandLine
from tests.autoresume.test_satellites import until
from tests.support.browser import assert_renders
from tests.support.running_cluster import running
from tests.support.sres_runs import clean_env, run_command, sres_command
from tests.support.slurm_cluster import SlurmCluster
from tests.support.training_jobs import sres_srun, submit_training, wait_job

NODES = 4
POLICY = {
    "grace_time_s": 30,
    "teams": {
        "vision": {"quota_nodes": 2, "weight": 3, "users": ["root"]},
        "speech": {"quota_nodes": 1, "weight": 1, "lend": False, "borrow": False, "users": ["root"]},
    },
    "priority_classes": {
        "inference": {"priority": 400},
        "training": {"priority": 300, "preempts": ["experiments"]},
        "experiments": {"priority": 100, "preempts_borrowed": False},
    },
}


@pytest.fixture(scope="module")
def accounted(tmp_path_factory: pytest.TempPathFactory):
    """A 3-node cluster with accounting, its slurm.conf holding the lines the policy needs."""
    lines = conf_lines(gp.from_data(POLICY))
    extra = "\n".join(f"{k}={v}" for k, v in lines.items())
    cluster = SlurmCluster(
        tmp_path_factory.mktemp("governance"), node_count=NODES, accounting=True, extra_conf=extra
    )
    with running(cluster, "Slurm test cluster with accounting"):
        yield cluster


def _sres(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess:
    """``sres governance ARGS`` as an admin runs it, whatever it exits with."""
    return _sres_top(cluster, "governance", *args, check=False)


def _sres_top(cluster: SlurmCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "launcher.entry", *args],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 or not check, done.stderr
    return done


def _dump(cluster: SlurmCluster) -> str:
    """Everything in the accounting database a policy could touch, as sacctmgr prints it."""
    env = cluster.env()
    out = []
    for what in (
        ["qos", "format=name,description,priority,preempt,preemptmode,gracetime,grptres"],
        ["account", "format=account,description"],
        ["assoc", "format=cluster,account,user,fairshare,grptres,qos,defaultqos"],
    ):
        out.append(
            subprocess.run(
                ["sacctmgr", "-nP", "show", *what],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout
        )
    return "\n".join(out)


def _write(tmp_path: Path, data: object, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _accounting(cluster: SlurmCluster, runner=subprocess.run) -> Accounting:
    return Accounting(CommandLine(env=cluster.env(), runner=runner))


def _reset(cluster: SlurmCluster) -> None:
    """No sres-made objects left from an earlier test (the empty policy's plan removes them)."""
    from launcher.governance import changes
    from launcher.governance.slurm_objects import Objects

    acc = _accounting(cluster)
    now, _ = read_managed(acc, cluster.cluster_name)
    for change in changes.plan(now, Objects.empty(), cluster.cluster_name):
        acc.change(change.args)


def test_apply_makes_the_policy_enforced_and_a_second_apply_changes_nothing(accounted, tmp_path):
    _reset(accounted)
    path = _write(tmp_path, POLICY)
    before = _dump(accounted)
    dry = _sres(accounted, "apply", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing changed" in dry.stdout and _dump(accounted) == before
    shown = [line for line in dry.stdout.splitlines() if line.startswith("sacctmgr -i ")]
    assert any(
        "add qos borrow" in line and "GraceTime=30" in line and "GrpTRES=node=3" in line for line in shown
    )
    assert "slurm.conf: the running controller has every setting" in dry.stdout

    done = _sres(accounted, "apply", str(path))
    assert done.returncode == 0, done.stderr
    assert f"applied {len(shown)} changes" in done.stdout
    now, _ = read_managed(_accounting(accounted), accounted.cluster_name)
    assert now == desired(gp.from_data(POLICY), NODES, None)
    qos = {q.name: q for q in _accounting(accounted).qos()}
    assert qos["training"].preempt == ("borrow", "experiments") and qos["experiments"].preempt == ()
    assert (qos["borrow"].preempt_mode, qos["borrow"].grace_time_s) == ("requeue", 30)

    again = _sres(accounted, "apply", str(path))
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr

    # Slurm enforces it: a vision job over the team's 2-node quota waits on the team's limit,
    # and a class the team may not use is refused at submission.
    env = accounted.env()
    sbatch = ["sbatch", "--parsable", "--account=vision", "--qos=training", "--wrap", "sleep 30"]
    job = subprocess.run(
        [*sbatch[:1], "-N3", *sbatch[1:]], env=env, capture_output=True, text=True, timeout=30
    )
    assert job.returncode == 0, job.stderr
    reason = _pending_reason(env, job.stdout.strip())
    subprocess.run(["scancel", job.stdout.strip()], env=env, timeout=30)
    assert "AssocGrpNodeLimit" in reason, reason
    refused = subprocess.run(
        ["sbatch", "--account=vision_borrow", "--qos=training", "--wrap", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0 and "qos" in refused.stderr.lower(), refused.stderr


def _pending_reason(env: dict[str, str], job_id: str) -> str:
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T %r"], env=env, capture_output=True, text=True, timeout=30
        ).stdout.strip()
        reason = out
        if "AssocGrp" in out:
            return out
        time.sleep(0.5)
    return reason


def test_a_changed_policy_changes_only_what_differs(accounted, tmp_path):
    _reset(accounted)
    assert _sres(accounted, "apply", str(_write(tmp_path, POLICY))).returncode == 0
    changed = yaml.safe_load(yaml.safe_dump(POLICY))
    changed["teams"]["vision"]["weight"] = 5
    changed["teams"]["speech"]["users"] = []
    del changed["priority_classes"]["inference"]
    path = _write(tmp_path, changed, "changed.yaml")
    dry = _sres(accounted, "apply", str(path), "--dry-run")
    commands = [line for line in dry.stdout.splitlines() if line.startswith("sacctmgr -i ")]
    c, classes = accounted.cluster_name, "QOS=experiments,training DefaultQOS=experiments"
    assert commands == [
        f"sacctmgr -i modify account where name=speech cluster={c} set {classes}",
        f"sacctmgr -i modify account where name=vision cluster={c} set Fairshare=5 {classes}",
        f"sacctmgr -i modify account where name=vision_borrow cluster={c} set Fairshare=5",
        f"sacctmgr -i delete user name=root account=speech cluster={c}",
        "sacctmgr -i delete qos name=inference",
    ], dry.stdout
    assert _sres(accounted, "apply", str(path)).returncode == 0
    now, _ = read_managed(_accounting(accounted), accounted.cluster_name)
    assert now == desired(gp.from_data(changed), NODES, None)


INVALID = {
    "quotas over the cluster": (
        {"teams": {"vision": {"quota_nodes": 4}, "speech": {"quota_nodes": 1}}},
        "quotas add up to 5 nodes; the cluster has 4",
    ),
    "unknown class": (
        {"teams": {"vision": {"quota_nodes": 1, "classes": ["batch"]}}},
        "teams.vision: unknown priority class 'batch'",
    ),
    "a preemption cycle": (
        {
            "priority_classes": {
                "a": {"priority": 1, "preempts": ["b"]},
                "b": {"priority": 2, "preempts": ["a"]},
            }
        },
        "cycle: a -> b -> a",
    ),
    "a typo": ({"teams": {"vision": {"quota_nodes": 1, "wieght": 2}}}, "unknown field 'wieght'"),
    "someone else's account": (
        {"teams": {"physics": {"quota_nodes": 1}}},
        "'physics' already exists in Slurm's accounting and was not made by sres",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_each_invalid_policy_is_refused_in_one_line_and_changes_nothing(accounted, tmp_path, case):
    env = accounted.env()
    subprocess.run(
        ["sacctmgr", "-i", "add", "account", "physics", f"Cluster={accounted.cluster_name}"],
        env=env,
        capture_output=True,
        timeout=30,
    )  # an admin's own account, not sres's
    change, message = INVALID[case]
    bad = {**yaml.safe_load(yaml.safe_dump(POLICY)), **change}
    before = _dump(accounted)
    done = _sres(accounted, "apply", str(_write(tmp_path, bad)))
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("sres: error: "), done.stderr
    assert _dump(accounted) == before


def test_a_change_slurm_refuses_part_way_is_undone(accounted, tmp_path):
    """Another admin removes a QOS this apply just made; the account that needs it is refused,
    and what the apply had made is removed again: the database is as it was."""
    _reset(accounted)
    env = accounted.env()
    before = _dump(accounted)

    def meddling(argv, **kwargs):
        if argv[:4] == ["sacctmgr", "-i", "add", "account"]:
            subprocess.run(
                ["sacctmgr", "-i", "delete", "qos", "name=training"], env=env, capture_output=True, timeout=30
            )
        return subprocess.run(argv, **kwargs)

    policy = gp.from_data(POLICY)
    client = SlurmClient.create("cli", env=env)
    with pytest.raises(Exception) as refused:
        apply(policy, client, _accounting(accounted, meddling), say=lambda line: None)
    assert "Slurm refused 'sacctmgr -i add account" in str(refused.value), refused.value
    assert "those were undone: nothing changed" in str(refused.value), refused.value
    assert _dump(accounted) == before


EXACT = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "2", "--ddp", "exact")
"""Exact mode: the same bits at world 2, 3 and 4, so a run that shrank and grew ends as one that did not."""


def _applied(cluster: SlurmCluster) -> None:
    _reset(cluster)
    client = SlurmClient.create("cli", env=cluster.env())
    apply(gp.from_data(POLICY), client, _accounting(cluster), say=lambda line: None)


def _reference(tmp_path: Path, steps: int) -> set[str]:
    """The model's bits after ``steps`` with no preemption: ``sres run`` on this machine, 2 nodes."""
    log_dir = tmp_path / "reference"
    cmd = sres_command(log_dir, 2, ("--no-tiers",), "resilience.examples.train_mlp", steps, EXACT)
    run = run_command(cmd, clean_env(), log_dir, 240)
    assert run.returncode == 0, run.stderr[-3000:]
    return {json.loads(p.read_text())["model_digest"] for p in (log_dir / "out").glob("rank*.json")}


def test_borrowed_nodes_are_taken_back_by_their_owner_and_the_borrower_shrinks_and_ends_exact(
    accounted, tmp_path
):
    """vision (quota 2) trains on 2 nodes of its own and grows onto 2 idle ones through its
    borrowing account; speech submits an inference job; Slurm preempts one borrowed node (QOS
    preemption, grace 30 s), sres gives it back at a step boundary, speech's job starts long before
    the grace time is up; vision grows back when it ends, and finishes with the bits of a run that
    was never preempted."""
    _applied(accounted)
    steps = 450
    job = submit_training(
        accounted,
        tmp_path,
        ["-N2", "--no-kill", "--exclusive", "--account=vision", "--qos=training"],
        sres_srun(
            tmp_path / "run",
            "--auto-resume=2",
            "-N",
            "2",
            "--max-nodes",
            "4",
            "--lend-account",
            "vision_borrow",
            "--grow-snooze",
            "1",
            "--no-tiers",
        ),
        sleep=0.15,
        train_args=("--steps", str(steps), *EXACT),
    )
    until("growth to 4", lambda: [e["to_world"] for e in job.of("resize")] == [4], job)
    borrowed = {s.job_id: s for s in job.client.jobs_named(f"sres-satellite-{job.job_id}")}
    assert {s.extra.get("Account") for s in borrowed.values()} == {"vision_borrow"}, borrowed
    assert {s.extra.get("QOS") for s in borrowed.values()} == {"borrow"}, borrowed
    listed = {
        r["job"]: r for r in map(json.loads, _sres_top(accounted, "jobs", "--json").stdout.splitlines())
    }
    assert (listed[job.job_id]["team"], listed[job.job_id]["class"], listed[job.job_id]["borrowed"]) == (
        "vision",
        "training",
        False,
    ), listed
    assert all((listed[j]["team"], listed[j]["borrowed"]) == ("vision", True) for j in borrowed), listed

    submitted = time.monotonic()
    claim = job.client.submit(
        [
            "--account=speech",
            "--qos=inference",
            "--exclusive",
            "-N1",
            f"--output={tmp_path / 'claim.out'}",
            "--wrap=sleep 8",
        ]
    )
    wait_job(job.client, claim, lambda j: j.running, timeout=60)
    claimed_s = time.monotonic() - submitted
    until("the shrink", lambda: len(job.of("resize")) >= 2, job)
    wait_job(job.client, claim, lambda j: j.finished, timeout=60)
    until("growth back to 4", lambda: job.of("resize")[-1]["to_world"] == 4, job, timeout=90)
    done = job.wait_done(timeout=300)
    assert done.state == "COMPLETED", job.output
    resizes = [(e["from_world"], e["to_world"], e["why"]) for e in job.of("resize")]
    assert resizes[:2] == [(2, 4, "idle"), (4, 3, "preempted")], resizes
    assert not job.of("fault"), job.output  # given back at a step boundary, not lost
    assert claimed_s < POLICY["grace_time_s"], f"speech's job waited {claimed_s:.1f} s"
    digests = {json.loads(p.read_text())["model_digest"] for p in (tmp_path / "out").glob("rank*.json")}
    assert digests == _reference(tmp_path, steps), job.output


def test_priority_classes_order_the_queue(accounted, tmp_path):
    """With every node taken, a low-priority job queued first and a high-priority one after: the
    high one starts first when the nodes free up."""
    _applied(accounted)
    client = SlurmClient.create("cli", env=accounted.env())
    out = f"--output={tmp_path / '%j.out'}"
    blocker = client.submit(
        ["--account=vision", "--qos=training", "--exclusive", "-N2", out, "--wrap=sleep 6"]
    )
    other = client.submit(
        ["--account=speech", "--qos=experiments", "--exclusive", "-N1", out, "--wrap=sleep 6"]
    )
    wait_job(client, blocker, lambda j: j.running, timeout=30)
    wait_job(client, other, lambda j: j.running, timeout=30)
    low = client.submit(
        ["--account=vision", "--qos=experiments", "--exclusive", "-N2", out, "--wrap=sleep 1"]
    )
    high = client.submit(["--account=vision", "--qos=inference", "--exclusive", "-N2", out, "--wrap=sleep 1"])
    first = wait_job(client, high, lambda j: j.running or j.finished, timeout=60)
    assert not client.job(low).running and not client.job(low).finished, "the low-priority job went first"
    assert first.extra.get("QOS") == "inference"
    wait_job(client, low, lambda j: j.finished, timeout=60)


def test_a_plain_job_on_borrowed_nodes_is_saved_requeued_and_resumes_from_its_step(accounted, tmp_path):
    """vision's own job holds its quota; a second vision job runs on 2 borrowed nodes (its
    borrowing account, ``--requeue``, ``--preempt-signal TERM``: the signal Slurm sends a preempted
    job's tasks at the start of its grace time). speech claims a node: the borrowed job saves its
    newest commit, requeues itself, waits, and resumes from that step when capacity frees; it ends
    with the bits of a run that was never preempted."""
    _applied(accounted)
    client = SlurmClient.create("cli", env=accounted.env())
    own = client.submit(
        [
            "--account=vision",
            "--qos=training",
            "--exclusive",
            "-N2",
            f"--output={tmp_path / 'own.out'}",
            "--wrap=sleep 25",
        ]
    )
    wait_job(client, own, lambda j: j.running, timeout=30)
    steps = 60
    job = submit_training(
        accounted,
        tmp_path,
        ["-N2", "--no-kill", "--exclusive", "--requeue", "--account=vision_borrow"],
        sres_srun(
            tmp_path / "run",
            "--auto-resume=1",
            "-N",
            "2",
            "--preempt-signal",
            "TERM",
            "--persistent-dir",
            str(tmp_path / "ckpt"),
            "--persist-every",
            "1000",
        ),
        sleep=0.15,
        train_args=("--steps", str(steps), *EXACT),
    )
    job.wait_step(10)
    submitted = time.monotonic()
    claim = client.submit(
        [
            "--account=speech",
            "--qos=inference",
            "--exclusive",
            "-N1",
            f"--output={tmp_path / 'claim.out'}",
            "--wrap=sleep 5",
        ]
    )
    requeued = job.wait(lambda j: j.restart_count >= 1, timeout=60)
    wait_job(client, claim, lambda j: j.running or j.finished, timeout=60)
    claimed_s = time.monotonic() - submitted
    assert requeued.restart_count == 1
    (flushed,) = job.of("flushed")
    assert "preempted" in job.of("requeue")[0]["why"], job.events
    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED", job.output
    (restored,) = job.of("restored")
    assert restored["step"] >= flushed["step"] >= 9, job.events
    assert job.of("finished")[-1]["steps"] == steps
    assert claimed_s < POLICY["grace_time_s"], f"speech's job waited {claimed_s:.1f} s"
    digests = {json.loads(p.read_text())["model_digest"] for p in (tmp_path / "out").glob("rank*.json")}
    assert digests == _reference(tmp_path, steps), job.output


def _sacct(cluster: SlurmCluster, since: float) -> list[list[str]]:
    """sacct's own records, read here apart from the report's reader."""
    env = {**cluster.env(), "SLURM_TIME_FORMAT": "%s"}
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    out = subprocess.run(
        [
            "sacct",
            "-a",
            "-X",
            "-D",
            "-nP",
            "-S",
            start,
            "-E",
            "now",
            "-o",
            "account,state,submit,start,end,nnodes",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is installed by tests/run.sh")
def test_the_dashboard_adds_up_to_sacct_and_renders_with_every_plot(accounted, tmp_path):
    """After the tests above (borrowing, a preemption, a requeue): the report's per-team numbers are
    sacct's, and a real browser renders the page with its three plots."""
    until_empty = time.monotonic() + 60
    while accounted.queue() and time.monotonic() < until_empty:
        time.sleep(0.5)
    assert not accounted.queue(), accounted.queue()
    time.sleep(2)  # slurmctld sends the last records to slurmdbd
    out = tmp_path / "governance.html"
    report = json.loads(
        _sres_top(accounted, "governance", "report", "--hours", "1", "--out", str(out), "--json").stdout
    )
    records = _sacct(accounted, report["since"])
    teams = {t["team"]: t for t in report["teams"]}
    for team in ("vision", "speech"):
        for account, key in ((team, "node_hours_own"), (f"{team}_borrow", "node_hours_borrowed")):
            seconds = sum(
                int(r[5]) * max(0.0, min(float(r[4]), report["until"]) - max(float(r[3]), report["since"]))
                for r in records
                if r[0] == account and r[3].isdigit() and r[4].isdigit()
            )
            assert teams[team][key] == pytest.approx(seconds / 3600, rel=1e-6, abs=1e-6), (team, key)
        preempted = sum(
            r[0] in (team, f"{team}_borrow") and r[1] in ("PREEMPTED", "REQUEUED") for r in records
        )
        assert teams[team]["preempted"] == preempted
    assert teams["vision"]["preempted"] >= 1 and teams["vision"]["node_hours_borrowed"] > 0
    assert report["top_borrowers"][0][0] == "vision"

    page = out.read_text()
    assert page.count('<img alt="') == 3
    assert all(f'alt="{html.escape(alt)}"' in page for alt in PLOTS.values())
    assert_renders(out, tmp_path / "shot.png", height=2200)


def test_without_an_accounting_database_apply_says_so_and_jobs_still_lists(cluster, tmp_path):
    """The shared test cluster runs no slurmdbd: apply and report refuse in one line; ``sres jobs``
    lists the tasks with their accounts for teams."""
    for args in (["governance", "apply", str(_write(tmp_path, POLICY))], ["governance", "report"]):
        done = subprocess.run(
            [sys.executable, "-m", "launcher.entry", *args],
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "keeps no accounting database (AccountingStorageType=accounting_storage/none)" in done.stderr
    client = SlurmClient.create("cli", env=cluster.env())
    job = client.submit(["-N1", f"--output={tmp_path / 'x.out'}", "--wrap=sleep 20"])
    listed = [json.loads(line) for line in _sres_top(cluster, "jobs", "--json").stdout.splitlines()]
    client.cancel(job)
    (row,) = [r for r in listed if r["job"] == job]
    assert row["class"] == "" and row["team"] == "" and row["borrowed"] is False, row
