"""Slurm's accounting for the test cluster: a private MariaDB server and slurmdbd, started and
stopped by the tests like slurmctld (Debian's ``mariadb-server`` and ``slurmdbd``).

Facts that shape it (checked here, Debian 12, MariaDB 10.11, Slurm 22.05.8):
- ``mariadb-install-db --no-defaults`` makes a data directory in under a second; ``mariadbd
  --no-defaults --skip-networking`` serves it on a socket of its own and never reads
  ``/etc/mysql``. Root connects over the socket as the unix user root (``unix_socket``).
- The ``mariadb-server`` package may have started a system server on ``/run/mysqld``. slurmdbd
  22.05 has no setting for a socket, but its MariaDB client library reads ``MYSQL_UNIX_PORT``:
  with ``StorageHost=localhost`` it reaches this server only.
- slurmdbd reads ``slurmdbd.conf`` from the directory of ``$SLURM_CONF`` (it has no ``-f``); the
  file must be 0600 and owned by ``SlurmUser``. With ``-D`` it is ready when it logs
  ``slurmdbd version ... started``.
- The cluster must be known to the database (``sacctmgr -i add cluster``) before slurmctld
  starts, or slurmctld refuses jobs whose association it cannot find.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

NEEDED = ("mariadbd", "mariadb-install-db", "my_print_defaults", "slurmdbd", "sacctmgr")
"""Debian: mariadb-server (mariadbd, mariadb-install-db), mariadb-client-core, slurmdbd."""


class AccountingUnavailable(RuntimeError):
    pass


class AccountingDaemons:
    """MariaDB and slurmdbd for one test cluster, in its directory (``directory``: where its
    slurm.conf is)."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = Path(directory), port
        self.db = self.directory / "mariadb"
        self.socket = self.db / "sock"
        self._mariadbd: subprocess.Popen | None = None
        self._slurmdbd: subprocess.Popen | None = None

    def conf_lines(self) -> str:
        """slurm.conf lines that send the cluster's accounting here."""
        return (
            "AccountingStorageType=accounting_storage/slurmdbd\n"
            "AccountingStorageHost=127.0.0.1\n"
            f"AccountingStoragePort={self.port}\n"
            "JobAcctGatherType=jobacct_gather/linux\n"
            "JobAcctGatherFrequency=30\n"
        )

    def up(self, env: dict[str, str], cluster: str, timeout: float = 60.0) -> None:
        missing = [c for c in NEEDED if shutil.which(c) is None]
        if missing:
            raise AccountingUnavailable(
                f"accounting is not installed (missing {', '.join(missing)}): run ./tests/run.sh, which "
                "installs mariadb-server, mariadb-client-core and slurmdbd"
            )
        log = self.directory / "log"
        log.mkdir(parents=True, exist_ok=True)
        self._start_mariadb(log, timeout)
        self._start_slurmdbd(env, log, timeout)
        _sacctmgr(env, "add", "cluster", cluster)

    def _start_mariadb(self, log: Path, timeout: float) -> None:
        data = self.db / "data"
        if not data.exists():
            self.db.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={data}",
                    "--user=root",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        self.socket.unlink(missing_ok=True)  # a stopped server's, which would pass for ready
        self._mariadbd = _spawn(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                f"--socket={self.socket}",
                "--skip-networking",
                f"--pid-file={self.db / 'mariadbd.pid'}",
                f"--log-error={log / 'mariadbd.log'}",
                "--innodb-buffer-pool-size=128M",  # what slurmdbd asks for, or it logs an error
                "--innodb-lock-wait-timeout=900",
            ],
            log / "mariadbd.out",
            None,
        )
        _wait(
            lambda: self.socket.exists(), self._mariadbd, timeout, f"mariadbd (log: {log / 'mariadbd.log'})"
        )

    def _start_slurmdbd(self, env: dict[str, str], log: Path, timeout: float) -> None:
        conf = self.directory / "slurmdbd.conf"
        conf.write_text(
            "AuthType=auth/munge\n"
            "DbdHost=localhost\n"
            "DbdAddr=127.0.0.1\n"
            f"DbdPort={self.port}\n"
            "SlurmUser=root\n"
            f"LogFile={log / 'slurmdbd.log'}\n"
            f"PidFile={self.directory / 'slurmdbd.pid'}\n"
            "StorageType=accounting_storage/mysql\n"
            "StorageHost=localhost\n"
            "StorageUser=root\n"
            f"StorageLoc=sres_acct_{self.port}\n"
        )
        os.chmod(conf, 0o600)
        started = log / "slurmdbd.log"
        seen = started.stat().st_size if started.exists() else 0  # started again: only its new lines
        self._slurmdbd = _spawn(
            ["slurmdbd", "-D"], log / "slurmdbd.out", {**env, "MYSQL_UNIX_PORT": str(self.socket)}
        )
        _wait(
            lambda: started.exists() and "started" in started.read_text(errors="replace")[seen:],
            self._slurmdbd,
            timeout,
            f"slurmdbd (log: {started})",
        )

    def stop_slurmdbd(self) -> None:
        """The accounting daemon alone goes (a fault: slurmctld keeps running and queues)."""
        _stop(self._slurmdbd)
        self._slurmdbd = None

    def down(self) -> None:
        _stop(self._slurmdbd)
        _stop(self._mariadbd)
        self._slurmdbd = self._mariadbd = None

    def pids(self) -> list[int]:
        return [p.pid for p in (self._slurmdbd, self._mariadbd) if p is not None and p.poll() is None]


def _sacctmgr(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True, timeout=30)
    if done.returncode != 0 and "Nothing new added" not in done.stdout:
        raise AccountingUnavailable(
            f"sacctmgr {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
        )


def _spawn(argv: list[str], out: Path, env: dict[str, str] | None) -> subprocess.Popen:
    with open(out, "ab") as log:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _wait(ready, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AccountingUnavailable(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise AccountingUnavailable(f"{what} did not start within {timeout:.0f} s")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
