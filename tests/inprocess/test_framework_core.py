"""What framework integrations need from the core, in real runs (issue 51, deliverable 1): a
default group a framework destroys when it is done ends the run, not a fault; the same error
seen again (naming another object address) stops the run at its second occurrence; the torchrun
variables stay consistent after a spare took over node 0's rank."""

from __future__ import annotations

import json
import sys
import textwrap

from tests.support.sres_runs import clean_env, run_command

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    import resilience

    mode, out = sys.argv[1], sys.argv[2]

    class Opaque:
        pass

    def train(ctx):
        state = {"x": 0.0}
        ctx.register(state=state)
        if mode == "raise-early":  # before the first step; the address differs in every process
            raise ValueError(f"cannot use {Opaque()}")
        for step in ctx.steps(6):
            t = torch.ones(1)
            dist.all_reduce(t)
            with ctx.commit():
                state["x"] += t.item()
        names = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        with open(os.path.join(out, f"rank{ctx.rank}.json"), "w") as f:
            json.dump({n: int(os.environ[n]) for n in names} | {"x": state["x"]}, f)
        if mode == "end-training":
            dist.destroy_process_group()  # what accelerate's end_training() does

    resilience.run(train)
    """
)


def _run(tmp_path, mode: str, *sres_args: str):
    script, out, log_dir = tmp_path / "train.py", tmp_path / "out", tmp_path / "run"
    script.write_text(SCRIPT)
    out.mkdir()
    cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "2", "--log-dir", str(log_dir),
           "--hang-timeout", "5", *sres_args, "--", sys.executable, str(script), mode, str(out)]  # fmt: skip
    run = run_command(cmd, clean_env(), log_dir, timeout=180)
    return run, {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def test_a_default_group_destroyed_when_train_is_done_ends_the_run(tmp_path):
    run, ranks = _run(tmp_path, "end-training")
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault"), run.of("fault")
    assert {r["x"] for r in ranks.values()} == {12.0}
    assert "run finished: 6 steps, 0 fault(s)" in run.stderr


def test_an_error_before_the_first_step_stops_at_its_second_occurrence(tmp_path):
    run, _ = _run(tmp_path, "raise-early")
    assert run.returncode == 1
    assert [f.get("recurred", False) for f in run.of("fault")] == [False, True], run.of("fault")
    (line,) = [line for line in run.stderr.splitlines() if "error:" in line]
    assert "the error is deterministic; not retrying" in line, run.stderr[-2000:]


def test_group_rank_matches_rank_after_a_spare_took_node_0(tmp_path):
    run, ranks = _run(tmp_path, "plain", "--spares", "1", "--inject", "node:0:step=3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["how"] for r in run.of("replaced")] == ["spare"], run.of("replaced")
    for rank, env in ranks.items():
        assert env["RANK"] == rank
        assert env["GROUP_RANK"] * env["LOCAL_WORLD_SIZE"] + env["LOCAL_RANK"] == rank, env
