"""``sres hooks install`` against a real sshd on loopback: files land, verification runs on the
node, a second install changes nothing, a node refusing the key is reported alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import sshd as sshd_server
from tests.support.slurm_cluster import pid_alive

REPO = Path(__file__).resolve().parents[2]
SRES = f"env PYTHONPATH={REPO} {sys.executable} -m launcher.entry"
FILES = ("health.yaml", "hooks/prolog", "hooks/epilog", "hooks/healthcheck")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not Path("/usr/sbin/sshd").exists() or shutil.which("ssh-keygen") is None:
        pytest.fail("openssh-server is not installed: run ./tests/run.sh (it installs it)", pytrace=False)
    server = sshd_server.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()
    assert not pid_alive(server.proc.pid)


def install(sshd, prefix: Path, *extra: str, nodes: str = "127.0.0.[1,3]", key: Path | None = None):
    argv = [
        sys.executable,
        "-m",
        "launcher.entry",
        "hooks",
        "install",
        "--nodes",
        nodes,
        "--port",
        str(sshd.port),
        "--key",
        str(key or sshd.key),
        "--known-hosts",
        str(sshd.known_hosts),
        "--prefix",
        f"{prefix}/%n",
        "--sres",
        SRES,
        "--env",
        f"PYTHONPATH={REPO}",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRES_"))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_install_verifies_reports_the_refusing_node_and_is_idempotent(sshd, tmp_path):
    prefix = tmp_path / "nodes"
    config = tmp_path / "health.yaml"
    config.write_text("checks:\n  memory:\n    min_free_mib: 64\n")

    first = install(sshd, prefix, "--config", str(config), nodes="127.0.0.[1-3]")
    assert first.returncode == 1, first.stdout + first.stderr
    lines = {line.split(":", 1)[0]: line for line in first.stdout.splitlines() if line.startswith("127.")}
    assert "verified, installed" in lines["127.0.0.1"] and "verified, installed" in lines["127.0.0.3"]
    assert "FAILED: authentication failed for root@127.0.0.2" in lines["127.0.0.2"]
    assert "1 of 3 node(s) failed: 127.0.0.2" in first.stderr and "Traceback" not in first.stderr
    assert not (prefix / "127.0.0.2").exists()
    for node in ("127.0.0.1", "127.0.0.3"):
        root = prefix / node
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(FILES)
        assert (root / "health.yaml").read_text() == config.read_text()
        assert os.access(root / "hooks/prolog", os.X_OK)
        assert f"{root}/health.yaml" in (root / "hooks/prolog").read_text()
        assert not list(prefix.glob("*.staging-*"))
    assert "Prolog=" in first.stdout and "HealthCheckProgram=" in first.stdout
    assert "nohold_on_prolog_fail" in first.stdout

    # The installed wrapper runs here as slurmd would run it (no PATH, no SLURM_CONF).
    verify = subprocess.run(
        [str(prefix / "127.0.0.1/hooks/prolog"), "--verify"],
        capture_output=True,
        text=True,
        env={"SLURMD_NODENAME": "n1"},
        timeout=60,
    )
    assert verify.returncode == 0 and "valid" in verify.stdout, verify.stderr

    before = snapshot(prefix)
    second = install(sshd, prefix, "--config", str(config))
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("verified, unchanged") == 2
    assert snapshot(prefix) == before

    config.write_text("checks:\n  memory:\n    min_free_mib: 128\n")
    third = install(sshd, prefix, "--config", str(config))
    assert third.returncode == 0 and third.stdout.count("installed health.yaml") == 2, third.stdout
    root = prefix / "127.0.0.1"
    assert "128" in (root / "health.yaml").read_text() and "64" in (root / "health.yaml.prev").read_text()


def test_a_node_that_fails_verification_is_left_unchanged(sshd, tmp_path):
    prefix = tmp_path / "nodes"
    good = install(sshd, prefix, nodes="127.0.0.1")
    assert good.returncode == 0, good.stdout + good.stderr
    before = snapshot(prefix)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.entry",
            "hooks",
            "install",
            "--nodes",
            "127.0.0.1",
            "--port",
            str(sshd.port),
            "--key",
            str(sshd.key),
            "--known-hosts",
            str(sshd.known_hosts),
            "--prefix",
            f"{prefix}/%n",
            "--sres",
            "/nonexistent/sres",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "FAILED: verification of hooks/prolog failed" in bad.stdout, bad.stdout
    assert snapshot(prefix) == before and not list(prefix.glob("*.staging-*"))


def test_unknown_host_key_is_refused_without_the_flag(sshd, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.entry",
            "hooks",
            "install",
            "--nodes",
            "127.0.0.1",
            "--port",
            str(sshd.port),
            "--key",
            str(sshd.key),
            "--prefix",
            str(tmp_path / "x"),
            "--sres",
            SRES,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert result.returncode == 1 and "--accept-unknown-hosts" in result.stdout, result.stdout
    assert not (tmp_path / "x").exists()


def test_apply_writes_slurm_conf_with_a_backup_once(sshd, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSchedulerParameters=permit_job_expansion\nProlog=/old/prolog\n")
    spank = tmp_path / "sres_auto_resume.so"
    spank.write_bytes(b"\x7fELF not really")
    args = ("--apply", "--slurm-conf", str(conf), "--spank", str(spank))
    first = install(sshd, tmp_path / "nodes", *args, nodes="127.0.0.1")
    assert first.returncode == 0, first.stdout + first.stderr
    text = conf.read_text()
    assert f"Prolog={tmp_path}/nodes/%n/hooks/prolog" in text and "/old/prolog" not in text
    assert "SchedulerParameters=permit_job_expansion,nohold_on_prolog_fail" in text
    assert (
        f"optional {tmp_path}/nodes/%n/spank/sres_auto_resume.so" in (tmp_path / "plugstack.conf").read_text()
    )
    assert (tmp_path / "nodes/127.0.0.1/spank/sres_auto_resume.so").read_bytes() == spank.read_bytes()
    backups = list(tmp_path.glob("slurm.conf.sres-backup-*"))
    assert len(backups) == 1 and "/old/prolog" in backups[0].read_text()
    second = install(sshd, tmp_path / "nodes", *args, nodes="127.0.0.1")
    assert second.returncode == 0 and "already has these lines" in second.stdout
    assert conf.read_text() == text and len(list(tmp_path.glob("slurm.conf.sres-backup-*"))) == 1
