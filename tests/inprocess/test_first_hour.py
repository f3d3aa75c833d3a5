"""A new user's first hour, as they ran it: their own script file, ``python``, ``sres run``; each
test asserts what that user checked (issue 53)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.sres_runs import clean_env, run_command, sres_run

THREADS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import resilience

    def train(ctx):
        for step in ctx.steps(2):
            pass
        out = os.path.join(sys.argv[1], f"rank{ctx.rank}.json")
        with open(out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}, f)

    resilience.run(train)
    """
)


def _threads_run(tmp_path, omp: str | None):
    script = tmp_path / "threads.py"
    script.write_text(THREADS_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    log_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "2", "--procs-per-node", "2",
           "--log-dir", str(log_dir), "--", sys.executable, str(script), str(out)]  # fmt: skip
    env = clean_env()
    env.pop("OMP_NUM_THREADS", None)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    run = run_command(cmd, env, log_dir, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_ranks_sharing_a_machine_get_one_thread_each_and_are_told(tmp_path):
    """torchrun's default: four ranks on this machine get OMP_NUM_THREADS=1, torch uses one
    thread in each, and the console says so once."""
    run, ranks = _threads_run(tmp_path, None)
    assert len(ranks) == 4
    assert {(r["threads"], r["omp"]) for r in ranks} == {(1, "1")}
    assert run.stderr.count("OMP_NUM_THREADS=1 for each rank") == 1, run.stderr[-2000:]


def test_a_thread_count_the_user_set_is_kept(tmp_path):
    run, ranks = _threads_run(tmp_path, "2")
    assert {(r["threads"], r["omp"]) for r in ranks} == {(2, "2")}
    assert "OMP_NUM_THREADS=1" not in run.stderr


def test_chaos_refuses_a_schedule_longer_than_the_run(tmp_path):
    """The chaos guide's plan, scaled down: more faults than the run has steps for. The fault-free
    run goes first; then one line says why no run with faults follows, and the exit is not 0."""
    cmd = [sys.executable, "-m", "launcher.cli", "chaos", "--faults", "12", "--seed", "6", "--every", "6",
           "--log-dir", str(tmp_path), "--", "--nodes", "2", "--", sys.executable, "-m",
           "resilience.examples.train_mlp", "--steps", "30"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=clean_env())
    assert done.returncode != 0
    refusal = [line for line in done.stderr.splitlines() if "would never fire" in line]
    assert len(refusal) == 1 and refusal[0].startswith("sres: error: "), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert (tmp_path / "reference" / "events.jsonl").exists()
    assert not (tmp_path / "chaos").exists()


def test_a_ranks_digest_and_the_finished_event_use_one_format(tmp_path):
    """``ctx.state_digest()`` (what the example writes to rank<R>.json) equals the ``finished``
    event's digest of that rank: one format, one content, comparable by eye."""
    run = sres_run(tmp_path, nodes=2, steps=6)
    assert run.returncode == 0, run.stderr[-2000:]
    (finished,) = run.of("finished")
    assert {str(r): d for r, d in run.digests().items()} == finished["state_digests"]
    assert all(d.startswith("xxh3-128:") for d in finished["state_digests"].values())


def test_the_guides_script_runs_alone_with_python(tmp_path):
    """training-loops.md: "`python train.py` alone also works: one process, no recovery". Its own
    train.py (plain DDP through resilience.ddp), started exactly so."""
    from tests.inprocess.test_docs_guide import GUIDE, runnable_blocks

    (block,) = [b for b in runnable_blocks((GUIDE / "training-loops.md").read_text()) if b.file == "train.py"]
    (tmp_path / "train.py").write_text(block.text)
    launched = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in clean_env().items() if k not in launched}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def _ckpt_run(tmp_path, name: str, steps: int, *extra: str) -> subprocess.CompletedProcess:
    out = str(tmp_path / name / "out")
    train = ["-m", "resilience.examples.train_mlp", "--steps", str(steps), "--out", out]
    cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "2", "--log-dir", str(tmp_path / name),
           "--persistent-dir", str(tmp_path / "ckpt"), "--persist-every", "4", *extra, "--", sys.executable,
           *train]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=clean_env())


def test_checkpoints_keep_the_last_step_say_what_was_restored_and_never_mix_jobs(tmp_path):
    """The checkpoints guide as a user follows it: a run with a persistent directory ends with its
    last step there (not only every K-th); the same job run again (same --job-id) says on the
    console which step it restored; another job pointed at that directory is refused in one line
    instead of overwriting the first job's manifests."""
    first = _ckpt_run(tmp_path, "first", 10, "--job-id", "mine")
    assert first.returncode == 0, first.stderr[-2000:]
    listing = subprocess.run([sys.executable, "-m", "launcher.cli", "ckpt", "ls", str(tmp_path / "ckpt")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    steps = [line.split()[0] for line in listing.stdout.splitlines()[1:] if line.strip()]
    assert steps[0] == "9", listing.stdout  # newest first: the last step, though not a multiple of 4

    again = _ckpt_run(tmp_path, "again", 14, "--job-id", "mine")
    assert again.returncode == 0, again.stderr[-2000:]
    said = [line for line in again.stderr.splitlines() if "restored step" in line]
    assert said == [said[0]] and "restored step 9 from the persistent tier" in said[0], again.stderr[-2000:]

    other = _ckpt_run(tmp_path, "other", 10, "--job-id", "theirs")
    assert other.returncode != 0
    refusal = [line for line in other.stderr.splitlines() if "holds job mine's checkpoints" in line]
    assert len(refusal) == 1 and refusal[0].startswith("sres: error: "), other.stderr[-2000:]
    assert "Traceback" not in other.stderr and not (tmp_path / "other" / "events.jsonl").exists()


SCHEDULED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import transformers
    import resilience

    BASE_LR = 0.1

    def train(ctx):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=BASE_LR)
        sched = transformers.get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=12)
        sampler = resilience.ElasticSampler(64, global_batch=16, micro_batch=1, seed=0)
        ctx.register(model=model, optimizer=opt, sched=sched, sampler=sampler)
        ddp = resilience.ddp(model)
        for step in ctx.steps(12):
            for indices in sampler.indices(step, ctx.rank, ctx.world_size):
                ddp(torch.ones(len(indices), 4)).sum().backward()
            scheduled, before = opt.param_groups[0]["lr"], model.weight.detach().clone()
            grad = float(model.weight.grad[0, 0])
            with ctx.commit():
                opt.step()
                opt.zero_grad()
                sched.step()
            if ctx.rank == 0:
                used = float((before - model.weight.detach())[0, 0]) / grad  # the LR the step used
                with open(os.path.join(sys.argv[1], "lr.jsonl"), "a") as f:
                    f.write(json.dumps({"step": step, "world": ctx.world_size, "scale": ctx.lr_scale,
                                        "scheduled": scheduled, "used": used}) + "\\n")

    resilience.run(train)
    """
)


def test_a_transformers_cosine_schedule_trains_at_the_scaled_rate_after_a_shrink(tmp_path):
    """The elastic guide with a `transformers` cosine schedule: 4 nodes shrink to 3 (global batch
    16 kept as 15, lr_scale 15/16); every step at world 3 moves the weights by the scheduler's LR
    times 15/16 (before: the schedule's unscaled LR at every step after the first)."""
    import math

    script = tmp_path / "scheduled.py"
    script.write_text(SCHEDULED_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    log_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "4", "--min-nodes", "3", "--inject",
           "node:3:step=4", "--log-dir", str(log_dir), "--", sys.executable, str(script),
           str(out)]  # fmt: skip
    run = run_command(cmd, clean_env(), log_dir, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "lr.jsonl").read_text().splitlines()]
    last = {line["step"]: line for line in lines}  # a step redone after the shrink: its last record
    shrunk = [line for line in last.values() if line["world"] == 3]
    assert shrunk and all(line["scale"] == 15 / 16 for line in shrunk), lines
    for line in last.values():
        scale = 15 / 16 if line["world"] == 3 else 1.0
        assert math.isclose(line["used"], line["scheduled"] * scale, rel_tol=1e-5), line
