"""Real node losses in one Slurm job (3 in CI, 10 under ``-m slow``): spares consumed and given
back, the result exact.

Each round kills the slurmd (and every process) of a random node that holds a rank, brings
slurmd back once the job has drained the node, waits for the job to recover and resumes the node
as an admin or the health hooks would; the job takes the resumed node back as a warm spare (a
node of the job that it drained and that is healthy again). The batch host is never the victim: it runs the
supervisor (a job that must survive its loss needs the supervisor off the training nodes).
"""

from __future__ import annotations

import json
import random
import time

import pytest

from resilience.contract.messages import STUCK_EXIT
from tests.support.sres_runs import sres_run
from tests.support.training_jobs import TrainingJob, sres_srun, submit_training

pytestmark = pytest.mark.cluster

SOAK_STEPS = {3: 240, 10: 450}
"""Steps per job by its losses. Seen here: 10 losses done by step 175 (about 8.5 s a round, a
drain taking 5 s of it); the job must outlast its last loss on a loaded CI machine too."""


@pytest.fixture(scope="module")
def soak_reference(tmp_path_factory):
    """The fault-free digests of a run of so many steps, each length run once."""
    made: dict[int, dict[int, str]] = {}

    def of(steps: int) -> dict[int, str]:
        if steps not in made:
            run = sres_run(tmp_path_factory.mktemp("soak-reference"), nodes=3, steps=steps)
            assert run.returncode == 0, run.stderr
            made[steps] = run.digests()
        return made[steps]

    return of


def _faults_and_replacements(job: TrainingJob) -> str:
    """In full (a tuple's repr is cut at 240 characters), with the output's tail."""
    kinds = ("fault", "replaced", "recovered", "node-added")
    lines = [json.dumps(e) for e in job.events if e["event"] in kinds]
    return "\n".join([*lines, job.output[-3000:]])


def _until(what: str, check, job: TrainingJob, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert not job.client.job(job.job_id).finished, (
            f"the job ended while waiting for {what}:\n{job.output}"
        )
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s:\n{job.output[-3000:]}"
        time.sleep(0.2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("losses", [3, pytest.param(10, marks=pytest.mark.slow)], ids=lambda n: f"{n}-losses")
def test_node_losses_in_one_job_with_spares_consumed_and_returned(cluster, tmp_path, soak_reference, losses):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N5", "--no-kill", "--requeue"],
        # The losses are the faults here. CI (2 cores, both lanes busy) once saw a survivor
        # silent for the tests' 5 s around the third loss, which was then replaced in place; a
        # longer wait keeps this test about nodes, and a real hang still fails it.
        sres_srun(tmp_path / "run", f"--auto-resume={3 * losses}", "-N", "3", "--hang-timeout", "15"),
        sleep=0.2,
        train_args=("--steps", str(SOAK_STEPS[losses]), "--progress-every", "10"),
    )
    job.wait_step(10)
    hosts = job.hosts()
    batch_host, where = hosts[0], dict(enumerate(hosts[:3]))  # rank -> host
    rng = random.Random(17)
    for loss in range(1, losses + 1):
        where.update({e["rank"]: e["host"] for e in job.of("replaced")})
        victim = rng.choice(sorted({h for h in where.values() if h != batch_host}))
        recovered = len(job.of("recovered"))
        drained = lambda: len([e for e in job.of("drained") if e["host"] == victim])  # noqa: E731
        before = drained()
        cluster.kill_node(victim)
        # slurmd back once the job has drained the node, before SlurmdTimeout (10 s) marks it DOWN,
        # which takes it out of the job for good. Not after the recovery: CI (2 cores, both lanes
        # busy) once took 16 s to recover from the third loss, and that node never came back.
        _until(f"the drain of {victim}", lambda: drained() > before, job)
        cluster.restart_node(victim)
        _until(f"recovery from loss {loss} ({victim})", lambda: len(job.of("recovered")) > recovered, job)
        cluster.resume(victim)  # it was drained ("sres: slurmd not responding"); an admin resumes it
        # The first loss's node left the job (its one NodeList shrink); every later one comes back.
        _until(f"a spare after loss {loss}", lambda: 2 - loss + len(job.of("node-added")) >= 1, job)

    done = job.wait_done(timeout=600)
    assert done.state == "COMPLETED" and done.restart_count == 0, job.output[-3000:]
    assert job.digests() == soak_reference(SOAK_STEPS[losses]), job.output[-3000:]
    faults = [e for e in job.of("fault") if e["kind"] == "node"]
    assert len(faults) == losses and all(e["why"] == "slurmd not responding" for e in faults), faults
    returned = [e for e in job.of("node-added") if e["how"] == "idle" and e.get("returned")]
    assert len(returned) >= losses - 2, returned
    # Every rank a lost node held was replaced on a node. A survivor that a node's loss left in a
    # collective the release could not interrupt in time (seen once in CI-sized runs: gloo, 2
    # loaded cores) ends itself with STUCK_EXIT and is restarted where it was, its node not blamed.
    stuck = {e["rank"] for e in job.of("fault") if e["kind"] == f"exit {STUCK_EXIT}"}
    elsewhere = [
        e for e in job.of("replaced") if e["how"] not in ("spare", "idle") and e["rank"] not in stuck
    ]
    assert not elsewhere, _faults_and_replacements(job)
    states = cluster.node_states()
    assert not [n for n, s in states.items() if "DRAIN" in s or "DOWN" in s], states  # every node resumed
    assert not cluster.queue(), cluster.queue()  # no job or step of the run left
