"""The GPU suite's CPU side (issue 55): everything of tests/gpu/ that runs without a device runs
here, so that a lent GPU's minutes are not spent finding a bug in the suite itself. The same
loop and runner on the CPU with gloo (the recovery path the NCCL tests take, minus the device),
the state benchmark with ``--device cpu``, and run.sh's skips and argument handling."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from benchmarks import gpu_state
from tests.gpu.cuda_runs import ROOT, cuda_run, explain, memory, result

SMALL = ("--width", "64", "--depth", "2", "--batch", "8")
RUN_SH = ROOT / "tests" / "gpu" / "run.sh"


def run_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SRES_GPU_WHEELS": str(tmp_path / "no-wheels")}
    return subprocess.run(["bash", str(RUN_SH), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_suite_s_loop_recovers_bitwise_on_the_cpu_after_faults_in_train_and_of_every_rank(tmp_path):
    reference = cuda_run(tmp_path / "reference", steps=30, train_args=SMALL)
    assert reference.returncode == 0, explain(reference)
    assert result(reference)["device"] == "cpu"
    # torch asks NVML, not the driver, in every process of a run: a fork server stays fork-safe.
    assert result(reference)["nvml_check"] == "1"
    raised = cuda_run(
        tmp_path / "raised",
        "--inject",
        "raise:rank=0:step=10",
        "--inject",
        "raise:rank=0:step=20",
        steps=30,
        train_args=SMALL,
    )
    assert raised.returncode == 0, explain(raised)
    assert result(raised)["digest"] == result(reference)["digest"]
    assert [line["step"] for line in memory(raised)] == [0, 10, 20]  # an entry into train per fault
    killed = cuda_run(tmp_path / "killed", "--inject", "kill-all:step=15", steps=30, train_args=SMALL)
    assert killed.returncode == 0, explain(killed)
    assert result(killed)["digest"] == result(reference)["digest"]
    assert [e["source"] for e in killed.of("recovered")] == ["ram"]


def test_the_state_benchmark_runs_on_the_cpu_and_restores_bitwise(tmp_path):
    summary = gpu_state.main(["--device", "cpu", "--sizes", "192", "--repeat", "1", "--dir", str(tmp_path)])
    row = summary["sizes"]["192"]
    assert row["exact"] == 1.0
    assert {"D2H floor", "tiered save", "dcp.async_save", "RAM tier", "torch.load", "tiered/floor"} <= set(
        row
    )


def test_run_sh_skips_every_gpu_test_with_its_reason_and_writes_its_files(tmp_path):
    proc = run_sh(tmp_path, "--quick")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no CUDA device here" in proc.stdout and " passed" not in proc.stdout
    assert {"env.txt", "log.txt", "junit.xml"} <= {p.name for p in (tmp_path / "out").iterdir()}


def test_run_sh_refuses_a_bad_argument_in_one_line(tmp_path):
    for args in (("--sizes", "1G"), ("--repeat", "0")):
        proc = run_sh(tmp_path, *args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
