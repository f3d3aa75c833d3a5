"""NCCL on one GPU: ``abort()`` of a communicator with a collective in flight, re-formation in
process, a restart from the RAM tier onto the device, and no device memory left behind by a
generation. One GPU holds one rank of a group (NCCL refuses two on one device), so every run
here is a world of one: what it shows is the rank's own path (abort, destroy, a new
communicator, CUDA state and random streams back exactly), not a collective across peers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.gpu.cuda_runs import ROOT, cuda_run, env, explain, memory, result
from tests.support.sres_runs import Run

STEPS = 30
LEAK_BYTES = 256 * 2**20
"""Device memory a generation may add over the one before it: less than one NCCL
communicator's buffers, so a communicator (or a model) kept alive per generation shows."""

ABORT = r"""
import json, time
import torch, torch.distributed as dist
from resilience.agent.abort import release
from resilience.contract import store_core

torch.cuda.set_device(0)
dev = torch.device("cuda", 0)

def form():
    dist.init_process_group("nccl", store=store_core.alone(), rank=0, world_size=1, device_id=dev)
    y = torch.ones(1 << 20, device=dev)
    dist.all_reduce(y)
    torch.cuda.synchronize()
    assert bool((y == 1).all()), "a world of one sums to itself"

def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free

form()
out = {"abort_s": [], "used": [used()]}
for generation in range(3):
    x = torch.ones(1 << 20, device=dev)
    torch.cuda._sleep(2_000_000_000)  # about a second of device time queued before the collective
    work = dist.all_reduce(x, async_op=True)
    out["in_flight_at_abort"] = not work.is_completed()
    started = time.perf_counter()
    release("nccl", None, [dist.group.WORLD])
    out["abort_s"].append(time.perf_counter() - started)
    dist.destroy_process_group()
    form()
    out["used"].append(used())
print(json.dumps(out))
"""


def test_abort_releases_a_collective_in_flight_and_a_new_communicator_forms_without_leaking(figures):
    proc = subprocess.run(
        [sys.executable, "-c", ABORT], capture_output=True, text=True, timeout=180, env=env(), cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for i, seconds in enumerate(out["abort_s"]):
        figures(f"abort {i + 1}", seconds, "s")
    figures("device memory after each formation", out["used"], "bytes")
    assert out["in_flight_at_abort"], "the collective was done before the abort: nothing was in flight"
    assert max(out["abort_s"]) < 5.0, out
    assert out["used"][-1] - out["used"][1] < LEAK_BYTES, out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Run:
    """The fault-free run both fault tests compare with."""
    run = cuda_run(tmp_path_factory.mktemp("reference"), steps=STEPS)
    assert run.returncode == 0, explain(run)
    return run


def test_a_fault_inside_train_reforms_nccl_in_process_and_ends_bitwise_with_dropout_on_the_gpu(
    tmp_path, figures, reference
):
    faulted = cuda_run(
        tmp_path / "faulted",
        "--inject",
        "raise:rank=0:step=10",
        "--inject",
        "raise:rank=0:step=20",
        steps=STEPS,
    )
    assert faulted.returncode == 0, explain(faulted)
    assert result(faulted)["device"].startswith("cuda"), result(faulted)
    assert result(faulted)["generation"] == result(reference)["generation"] + 2, result(faulted)
    assert result(faulted)["digest"] == result(reference)["digest"], "not the fault-free run's bits"
    lines = memory(faulted)
    figures("memory at each entry into train", lines)
    assert len(lines) == 3, lines  # the first entry and one after each fault
    second, third = lines[1], lines[2]  # both after a restore: the same model and optimizer state
    assert third["allocated"] == second["allocated"], lines
    assert third["device_used"] - second["device_used"] < LEAK_BYTES, lines
    recovered = faulted.of("recovered")
    figures("recovery", [e.get("seconds") for e in recovered], "s")
    # The rank was forked from its node's fork server and still had its GPU: the server did not
    # start CUDA (PYTORCH_NVML_BASED_CUDA_CHECK, a warm-up without the optimizer's stream check).
    fallbacks = faulted.of("fork-fallback")
    figures("fork fallbacks", [e.get("why") for e in fallbacks])
    assert not fallbacks, fallbacks


def test_every_rank_killed_restarts_from_the_ram_tier_onto_the_gpu_and_ends_bitwise(
    tmp_path, figures, reference
):
    faulted = cuda_run(tmp_path / "faulted", "--inject", "kill-all:step=15", steps=STEPS)
    assert faulted.returncode == 0, explain(faulted)
    assert result(faulted)["digest"] == result(reference)["digest"], "not the fault-free run's bits"
    recovered = faulted.of("recovered")
    assert recovered and recovered[-1]["source"] not in ("self", "peer"), recovered  # a tier served it
    figures(
        "restart", [{k: e.get(k) for k in ("source", "bytes", "seconds", "steps_lost")} for e in recovered]
    )
