"""Training jobs on a real Slurm cluster (tests/support/slurm_cluster.py), supervised by ``sres srun``.

Shared by the auto-resume tests and ``benchmarks/auto_resume.py``.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.observability.events import read_events
from launcher.slurm.client import SlurmClient
from launcher.slurm.types import Job
from tests.support.slurm_cluster import SlurmCluster


def wait_job(client: SlurmClient, job_id: str, predicate, timeout: float = 60.0) -> Job:
    """Poll Slurm until the job satisfies ``predicate``; fail with its last state."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if predicate(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state} ({job.reason}) after {timeout:.0f} s")
        time.sleep(0.2)


REPO = Path(__file__).resolve().parents[2]
STEPS = 30
TRAIN = ("-m", "resilience.examples.train_mlp", "--steps", str(STEPS), "--progress-every", "1")


@dataclass
class TrainingJob:
    job_id: str
    dir: Path
    client: SlurmClient

    @property
    def log_dir(self) -> Path:
        return self.dir / "run"

    @property
    def events(self) -> list[dict]:
        path = self.log_dir / "events.jsonl"
        return read_events(path) if path.exists() else []

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    @property
    def output(self) -> str:
        path = self.dir / "job.out"
        return path.read_text() if path.exists() else ""

    def digests(self) -> dict[int, str]:
        return {
            json.loads(p.read_text())["rank"]: json.loads(p.read_text())["digest"]
            for p in sorted((self.dir / "out").glob("rank*.json"))
        }

    def hosts(self) -> list[str]:
        """Nodes in rank order then spares, as the supervisor placed them at its (last) start."""
        return self.of("start")[-1]["hosts"]

    def wait_step(self, step: int, timeout: float = 90.0) -> None:
        """Until rank 0 has printed ``step``: the job is training."""
        deadline = time.monotonic() + timeout
        pattern = re.compile(rf"^step\s+{step}/", re.M)
        while not pattern.search(self.output):
            job = self.client.job(self.job_id)
            assert not job.finished, (
                f"job {self.job_id} ended ({job.state}) before step {step}:\n{self.output}"
            )
            assert time.monotonic() < deadline, f"no step {step} after {timeout:.0f} s:\n{self.output}"
            time.sleep(0.1)

    def wait(self, predicate, timeout: float = 60.0) -> Job:
        """:func:`wait_job` for this job; a failure shows what the job printed and its last events,
        so that a CI log says where it stood."""
        try:
            return wait_job(self.client, self.job_id, predicate, timeout)
        except AssertionError as err:
            tail = "\n".join(json.dumps(e) for e in self.events[-25:])
            output = self.output[-6000:]
            raise AssertionError(f"{err}\n--- job output:\n{output}\n--- last events:\n{tail}") from None

    def wait_done(self, timeout: float = 180.0) -> Job:
        return self.wait(lambda j: j.finished, timeout)


def submit_training(
    cluster: SlurmCluster,
    tmp: Path,
    sbatch: list[str],
    srun: str,
    sleep: float = 0.25,
    train_args: tuple[str, ...] = (),
) -> TrainingJob:
    """An sbatch job whose script runs ``srun`` (a shell fragment, e.g. ``sres srun --auto-resume=1 -N 3``)
    on the example MLP, with ``--out``/``--log-dir`` in ``tmp``."""
    train = " ".join(
        shlex.quote(a)
        for a in (sys.executable, *TRAIN, "--sleep-s", str(sleep), "--out", str(tmp / "out"), *train_args)
    )
    script = tmp / "job.sh"
    script.write_text(f"#!/bin/bash\ncd {shlex.quote(str(REPO))}\n{srun} {train}\n")
    client = SlurmClient.create("cli", env=cluster.env())
    # The job's directory is tmp: Slurm writes slurm_job_<id>_resize.sh there when the job resizes.
    job_id = client.submit([*sbatch, f"--output={tmp / 'job.out'}", f"--chdir={tmp}", str(script)])
    return TrainingJob(job_id, tmp, client)


def sres_srun(log_dir: Path, *args: str, module: str = "launcher.cli") -> str:
    """The shell fragment that runs ``sres srun`` (the module, as in the repository under test);
    ``module="launcher.entry"``: as the installed console script, which latches the requeue signal first."""
    return " ".join(
        [
            shlex.quote(sys.executable),
            "-m",
            module,
            "srun",
            "--log-dir",
            shlex.quote(str(log_dir)),
            "--hang-timeout",
            "5",
            *args,
        ]
    )
