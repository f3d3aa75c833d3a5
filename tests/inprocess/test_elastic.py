"""Elastic runs end to end: the world shrinks after a node loss with no spare and grows on
request, every sample of an epoch is trained once, and the result matches a fixed-size run."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from resilience.elastic import coverage
from tests.support.sres_runs import sres, sres_run, when_event

DATA = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "4")
STEPS = 60
LOSS_RTOL = 1e-4
"""Final eval loss of a resized run vs a fixed-size run with the same global batch: the same
samples and steps, only the gradient sums are grouped differently (measured: ~1e-7)."""


def eval_losses(log_dir: Path) -> set[float]:
    return {json.loads(p.read_text())["eval_loss"] for p in (log_dir / "out").glob("rank*.json")}


@pytest.fixture(scope="module")
def fixed_size(tmp_path_factory) -> float:
    run = sres_run(tmp_path_factory.mktemp("fixed"), "--no-tiers", steps=STEPS, train_args=DATA)
    assert run.returncode == 0, run.stderr
    (loss,) = eval_losses(run.log_dir)
    return loss


def assert_every_sample_once(log_dir: Path, steps: int) -> None:
    cov = coverage(log_dir)
    assert cov.steps == steps and not cov.gaps and not cov.overlaps
    for epoch, counts in cov.counts.items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: a sample trained more than once"
    assert len(cov.complete_epochs(200)) == steps * 24 // 200


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "sharded"])
def test_four_three_four(tmp_path, fixed_size, sharded):
    """A node lost with no spare: the world shrinks to 3; `sres grow` brings it back to 4."""
    log_dir = tmp_path / "run"
    replies: dict[str, subprocess.CompletedProcess] = {}

    def control() -> None:
        replies["too-big"] = sres("resize", str(log_dir), "--nodes", "9")
        replies["wrong-token"] = _wrong_token(log_dir)
        replies["grow"] = sres("grow", str(log_dir), "--by", "1")
        replies["status"] = sres("status", str(log_dir), "--json")

    watcher = when_event(log_dir, lambda e: e["event"] == "resize" and e["to_world"] == 3, control)
    run = sres_run(
        tmp_path,
        "--no-tiers",
        "--min-nodes",
        "2",
        "--max-nodes",
        "4",
        "--inject",
        "node:1:step=5",
        steps=STEPS,
        # 0.4 s a step: room for three sres commands, each seconds to start on a loaded machine
        # (CI saw the run end before the grow it had accepted came into effect at 0.2 s)
        train_args=(*DATA, "--sleep-s", "0.4", *(("--sharded",) if sharded else ())),
    )
    watcher.join(timeout=5)
    assert run.returncode == 0, run.stderr
    resizes = [(e["from_world"], e["to_world"], e["why"]) for e in run.of("resize")]
    assert resizes == [(4, 3, "fault"), (3, 4, "request")], run.stderr
    assert all(e["global_batch"] == 24 and e["lr_scale"] == 1.0 for e in run.of("resize"))
    assert replies["grow"].returncode == 0 and "resizing from 3 to 4" in replies["grow"].stdout
    assert replies["too-big"].returncode == 1
    assert replies["too-big"].stderr.strip() == "sres: error: refused: 9 node(s) is above --max-nodes 4"
    assert "wrong token" in replies["wrong-token"].stdout
    assert json.loads(replies["status"].stdout)["world_size"] in (3, 4)
    finished = sres("status", str(log_dir))
    assert finished.returncode == 1 and finished.stderr.count("\n") == 1 and "has finished" in finished.stderr
    assert_every_sample_once(log_dir, STEPS)
    losses = eval_losses(log_dir)
    assert len(losses) == 1  # replicas agree
    assert abs(losses.pop() - fixed_size) <= LOSS_RTOL * fixed_size
    assert "resize" in run.stderr and "4 -> 3" in run.stderr


def _wrong_token(log_dir: Path) -> subprocess.CompletedProcess:
    address = json.loads((log_dir / "control.json").read_text())
    with socket.create_connection((address["host"], address["port"]), timeout=10) as conn:
        conn.sendall(b'{"token": "not-the-token", "op": "grow", "by": 1}\n')
        reply = conn.makefile("r").readline()
    return subprocess.CompletedProcess([], 0, reply, "")


def test_global_batch_the_new_world_does_not_divide(tmp_path):
    """20 samples per step on 4 ranks, then 3: the closest global batch 3 divides (21) and a
    linear LR scale are used and reported; no crash, every sample still once."""
    run = sres_run(
        tmp_path,
        "--no-tiers",
        "--min-nodes",
        "2",
        "--inject",
        "node:3:step=4",
        steps=20,
        train_args=("--dataset", "100", "--global-batch", "20", "--micro-batch", "4"),
    )
    assert run.returncode == 0, run.stderr
    (resize,) = run.of("resize")
    assert (resize["global_batch"], resize["accumulation"]) == (21, 2)
    assert resize["lr_scale"] == pytest.approx(21 / 20)
    cov = coverage(run.log_dir)
    assert not cov.gaps and not cov.overlaps and all(set(c.values()) == {1} for c in cov.counts.values())
    assert cov.worlds == (4,) * 4 + (3,) * 16


def test_below_min_nodes_waits_then_fails_clearly(tmp_path):
    run = sres_run(
        tmp_path,
        "--no-tiers",
        "--min-nodes",
        "4",
        "--max-nodes",
        "5",
        "--on-no-spare",
        "wait",
        "--resize-timeout",
        "2",
        "--inject",
        "node:2:step=4",
        steps=20,
        train_args=DATA,
    )
    assert run.returncode == 1
    (waiting,) = run.of("waiting")
    (failed,) = run.of("failed")
    assert failed["t"] - waiting["t"] >= 2.0
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "no node came within --resize-timeout 2 s" in lines[0], run.stderr
    assert run.digests() == {}  # nothing went on with a world it may not have
    assert not run.of("resize")


def test_control_of_an_unknown_run_is_one_line(tmp_path):
    reply = sres("grow", str(tmp_path / "nothing-here"), "--by", "1")
    assert reply.returncode == 1 and reply.stderr.count("\n") == 1 and "no run at" in reply.stderr
