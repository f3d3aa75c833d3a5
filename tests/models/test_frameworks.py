"""Frameworks under sres: a Lightning ``Trainer`` with ``ResilientEnvironment`` and
``ResilientCallback``, and a Hugging Face ``ResilientTrainer``, each end bitwise identical to their
own fault-free run after a process kill taken over by a standby, a node loss served by a spare and
a kill of every rank served by the RAM tier, having trained the same samples at every step, on the
framework's default data path (Lightning: a plain ``DataLoader(shuffle=True)`` it injects its
sampler into; the Trainer: its own sampler and accelerate's sharded loader), and an `accelerate`
loop whose prepared loader is wrapped in ``resumable`` and which ends with ``end_training()``, and a
``lightning.Fabric`` loop whose set-up loader is wrapped in Lightning's ``resumable``.
The dataset is small enough that the runs cross epochs: the first fault resumes from the last
step of an epoch, the others from inside one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.models.test_zoo import check_sample_log, finals, sample_differences, succeeded
from tests.support.sres_runs import clean_env
from tests.support.titan_env import titan_python
from tests.support.zoo_runs import FAULTS, NODES, STEPS, ZooRun, zoo_run

pytestmark = [pytest.mark.models, pytest.mark.timeout(900)]

EPOCHS = ("--dataset-size", "40")
"""Two ranks of 4 samples a step (Lightning: batches of 4; the Trainer: 2 x 2 accumulated): 5
steps an epoch, so 18 steps cross three epochs."""

FRAMEWORKS = ("lightning_ddp", "hf_trainer", "accelerate_loop", "fabric_loop")


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, ZooRun]:
    return {}


def _reference(references: dict[str, ZooRun], factory, case: str) -> ZooRun:
    if case not in references:
        run = zoo_run(factory.mktemp(f"ref-{case}"), case, train_args=EPOCHS)
        succeeded(run)
        references[case] = run
    return references[case]


@pytest.mark.parametrize("case", FRAMEWORKS)
def test_each_fault_kind_ends_bitwise_identical(tmp_path, tmp_path_factory, references, case):
    reference = _reference(references, tmp_path_factory, case)
    run = zoo_run(tmp_path, case, *FAULTS, train_args=EPOCHS)
    recovered_in_process_bitwise(run, reference)


def recovered_in_process_bitwise(run: ZooRun, reference: ZooRun) -> None:
    """Each fault recovered as it should be, from the last commit, and the run ends as its
    fault-free reference: the same samples at every step, the same bits."""
    succeeded(run)
    hows = {(r["rank"], r["how"]) for r in run.of("replaced")}
    assert {(1, "standby"), (1, "spare")} <= hows, run.of("replaced")
    assert {r["source"] for r in run.of("recovered")} >= {"peer", "ram"}, run.of("recovered")
    # In process: each recovery resumed after the last commit, no step redone from disk.
    assert {r["step"] for r in run.of("recovered")} == {4, 8, 12}, run.of("recovered")
    check_sample_log(run)
    differences = sample_differences(run, reference)
    assert not differences, "\n".join(differences[:8])
    assert finals(run) == finals(reference)


@pytest.mark.slow
def test_lightning_with_gradient_accumulation_ends_bitwise_identical(tmp_path):
    """``accumulate_grad_batches=2``: a step is two batches and one optimizer step; its commit
    closes after the second, and a resumed epoch skips both batches of every trained step."""
    accumulate = (*EPOCHS, "--accumulate")  # 5 batches an epoch: its last step is one batch
    reference = zoo_run(tmp_path, "lightning_ddp", train_args=accumulate, name="reference")
    succeeded(reference)
    run = zoo_run(tmp_path, "lightning_ddp", *FAULTS, train_args=accumulate)
    succeeded(run)
    check_sample_log(run)
    assert not sample_differences(run, reference)
    assert finals(run) == finals(reference)


REFUSALS = [
    (
        "accelerate_loop",
        "--register-prepared",
        "register resilience.integrations.accelerate.resumable(loader)",
    ),
    pytest.param(
        "fabric_loop",
        "--register-fabric-loader",
        "register resilience.integrations.lightning.resumable(loader)",
        marks=pytest.mark.slow,
    ),
    ("lightning_ddp", "--stateful-loader", "sampler is a RandomSampler (in a DistributedSamplerWrapper)"),
    pytest.param(
        "lightning_ddp",
        "--no-environment",
        "pass plugins=[ResilientEnvironment(ctx)]",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "lightning_ddp", "--wrong-devices", "devices=ctx.place.local_world_size (1)", marks=pytest.mark.slow
    ),
]
"""Two in CI (one per framework's way of refusing), the others in the slow set: each is a run."""


@pytest.mark.parametrize("case, flag, said", REFUSALS)
def test_what_cannot_resume_exactly_is_refused_in_one_line(tmp_path, case, flag, said):
    """Refused before the first step, once (not retried: it would be the same on every entry)."""
    run = zoo_run(tmp_path, case, train_args=(*EPOCHS, flag), steps=4)
    assert run.returncode == 1, run.tail()
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and said in lines[0], run.tail()
    assert "Traceback" not in run.stderr
    assert not run.of("fault") or all(f["kind"] == "refused" for f in run.of("fault")), run.of("fault")
    assert not any(run.sample_lines().values())


# --- torchtitan: in an environment of its own (tests/support/titan_env.py), in the slow set -----

TITAN = "torchtitan_llama"


@pytest.fixture(scope="module")
def titan(tmp_path_factory) -> tuple[str, tuple[str, ...]]:
    """The interpreter with torchtitan, and the case's arguments (its tokenizer and 40 texts:
    about 11 steps an epoch, so 18 steps re-loop the dataset with torchtitan's shuffle)."""
    python = titan_python()
    assets = tmp_path_factory.mktemp("titan-assets")
    made = [python, "-m", f"tests.models.{TITAN}", "--make-assets", *EPOCHS, "--out", str(assets)]
    subprocess.run(made, check=True, timeout=120, capture_output=True)
    return python, (*EPOCHS, "--assets", str(assets))


def _under_torchrun(python: str, out: Path, train_args: tuple[str, ...], *extra: str):
    """The torchtitan case as its users run it, under torchrun, no sres piece."""
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NODES)]
    cmd += ["-m", f"tests.models.{TITAN}", "--steps", str(STEPS), "--out", str(out), *train_args, *extra]
    return subprocess.run(
        cmd, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600
    )


def _torchtitan_alone(tmp_path: Path, python: str, train_args: tuple[str, ...]) -> dict[int, dict]:
    """torchtitan alone, its checkpoints on (one, after the last step): rank -> its final shas."""
    out = tmp_path / "alone"
    done = _under_torchrun(python, out, train_args, "--classic-every", str(STEPS + 1))
    assert done.returncode == 0, done.stderr[-4000:]
    ended = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    return {data["rank"]: {k: data[k] for k in ("model_sha", "optimizer_sha")} for data in ended}


@pytest.mark.slow
def test_torchtitan_ends_bitwise_identical_and_as_torchtitan_alone(tmp_path, titan):
    """Its Trainer on the replicate path (HSDP, shard 1) under the three fault kinds: the same
    samples at every step and the same bits as its fault-free sres run, and as torchtitan run
    without sres at all (what a user compares with)."""
    python, train_args = titan
    reference = zoo_run(tmp_path, TITAN, train_args=train_args, name="reference", python=python)
    succeeded(reference)
    run = zoo_run(tmp_path, TITAN, *FAULTS, train_args=train_args, python=python)
    recovered_in_process_bitwise(run, reference)
    alone = _torchtitan_alone(tmp_path, python, train_args)
    assert alone == {rank: {k: v[k] for k in alone[rank]} for rank, v in run.finals().items()}


@pytest.mark.slow
def test_torchtitan_with_pipeline_parallelism_is_refused_in_one_line(tmp_path, titan):
    python, train_args = titan
    run = zoo_run(tmp_path, TITAN, train_args=(*train_args, "--pipeline"), steps=4, python=python)
    assert run.returncode == 1, run.tail()
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "pipeline_parallel_degree=2" in lines[0], run.tail()
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_torchtitan_started_afresh_goes_on_from_its_own_checkpoint(tmp_path, titan):
    """A job requeued with nothing of sres's left (no peer, no tier): torchtitan's own newest
    checkpoint (step 10 of a run that crashed at 12) is where the commits go on from, and the run
    ends as torchtitan alone does."""
    python, train_args = titan
    out = tmp_path / "run" / "out"
    done = _under_torchrun(python, out, train_args, "--classic-every", "5", "--crash-at", "12")
    assert done.returncode != 0 and (out / "crashed.json").exists(), done.stderr[-3000:]
    run = zoo_run(tmp_path, TITAN, train_args=(*train_args, "--own-checkpoints"), python=python)
    succeeded(run)
    trained = sorted({step for _, step in run.trained()})
    assert trained == list(range(10, STEPS)), trained  # torchtitan's steps 11..18: sres's 10..17
    alone = _torchtitan_alone(tmp_path, python, train_args)
    assert alone == {rank: {k: v[k] for k in alone[rank]} for rank, v in run.finals().items()}
