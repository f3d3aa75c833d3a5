"""How many drawn fault schedules end with the fault-free bits: issue 50's "fraction of schedules
that pass before and after the fix", as a table.

    sudo python benchmarks/schedule_fraction.py --count 200
    sudo python benchmarks/schedule_fraction.py --count 200 --before /tmp/before   # and a baseline
    sudo python benchmarks/schedule_fraction.py --count 200 --before /tmp/before --skip 120 --trees before

The schedules are hypothesis's draws of ``tests/network/test_schedules.py`` (derandomized: the same
ones in every run, in the same order); each runs whole on namespaced nodes, and a failing one does
not stop the rest (the property test stops at the first). ``--before``: each schedule also runs,
right after, on that checkout's code (its ``sres run``, its ranks; the harness stays this one's):
"before a fix" is a worktree with the fix taken out. Needs root (namespaces); ~15 s a schedule and
a tree on 2 cores. ``--skip N`` draws the first N schedules and runs none of them (an earlier run
measured them: the draws are the same, in the same order, as long as ``run_one`` is unchanged:
hypothesis seeds them from its source); ``--trees`` runs a schedule on some of the checkouts only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.inprocess.test_elastic import assert_every_sample_once  # noqa: E402
from tests.network.test_schedules import CACHE, NODES, STEPS, model_digests, schedules  # noqa: E402
from tests.network.conftest import EXACT  # noqa: E402
from tests.support.netns import Network, available  # noqa: E402
from tests.support.sres_runs import clean_env, run_command, sres_command  # noqa: E402


def reference(tmp: Path) -> set[str]:
    log_dir = tmp / "reference" / "run"
    cmd = sres_command(log_dir, NODES, ("--no-tiers",), "resilience.examples.train_mlp", STEPS, (*EXACT,))
    return model_digests(run_command(cmd, clean_env(), log_dir, 240))


def outcome(
    tree: Path, log_dir: Path, net: Network, bits: set[str], options: list[str], train: tuple[str, ...]
) -> str:
    """What ``tests/network/test_schedules.py:check`` asserts, as a word: ``passed``, ``other bits``,
    ``samples`` (one trained twice or never) or ``failed`` (the run's own error, a leftover process,
    a timeout). Never raises, so that every schedule runs; a passed run's files are removed."""
    net.reset()
    members = NODES - int("--spares" in options)
    cmd = sres_command(log_dir, members, tuple(options), "resilience.examples.train_mlp", STEPS, train, 4)
    os.chdir(tree)  # `python -m` looks in the working directory first: the tree's sres, its ranks
    try:
        run = run_command(cmd, clean_env(SRES_NETNS=net.variable, PYTHONPATH=str(tree)), log_dir, 240)
    except (AssertionError, subprocess.TimeoutExpired) as err:
        print(f"  {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
        return "failed"
    finally:
        os.chdir(REPO)
    if run.returncode != 0:
        return "failed"
    if model_digests(run) != bits:
        return "other bits"
    try:
        assert_every_sample_once(log_dir, STEPS)
    except AssertionError:
        return "samples"
    shutil.rmtree(log_dir, ignore_errors=True)
    return "passed"


class Trees(dict):
    """The checkouts each drawn schedule runs on, by name; none for the first ``skip`` draws.
    ``run_one`` asks for them once a schedule (``items()``), and its source must not change (it
    seeds hypothesis's draws), so skipping is done here."""

    def __init__(self, trees: dict[str, Path], skip: int) -> None:
        super().__init__(trees)
        self.skip, self.drawn = skip, 0

    def items(self):  # type: ignore[override]
        self.drawn += 1
        return super().items() if self.drawn > self.skip else {}.items()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200, help="schedules drawn (default 200)")
    p.add_argument("--before", type=Path, help="a checkout to run each schedule on too (the baseline)")
    p.add_argument("--skip", type=int, default=0, help="draw the first N schedules, run none of them")
    p.add_argument("--trees", help="run each schedule on these only, e.g. before (default: all)")
    args = p.parse_args()
    why = available()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    every = {"now": REPO, **({"before": args.before.resolve()} if args.before else {})}
    chosen = args.trees.split(",") if args.trees else list(every)
    if not set(chosen) <= set(every):
        print(f"error: --trees {args.trees}: not among {', '.join(every)}", file=sys.stderr)
        return 1
    trees = Trees({name: every[name] for name in chosen}, args.skip)
    rows: list[tuple[str, str, str, float]] = []  # (tree, kind, outcome, seconds)
    tmp = Path(tempfile.mkdtemp(prefix="sres-schedules-"))
    ram = Path(tempfile.mkdtemp(prefix="sres-schedules-ram-", dir="/dev/shm"))
    os.environ["SRES_RAM_ROOT"] = str(ram)  # the runs' RAM tiers: private, removed at the end
    net = Network(NODES).up()
    try:
        bits = reference(tmp)

        @settings(
            max_examples=args.count,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(schedule=schedules())
        def run_one(schedule: tuple[list[str], tuple[str, ...]]) -> None:
            options, train = schedule
            kind = "batch cache" if set(CACHE) <= set(train) else "batches made in the loop"
            for name, tree in trees.items():
                t0 = time.monotonic()
                got = outcome(tree, tmp / f"run-{len(rows)}", net, bits, options, train)
                rows.append((name, kind, got, time.monotonic() - t0))
                print(f"{len(rows):4d} {name:6s} {got:10s} {kind:24s} {' '.join(options)}", flush=True)

        run_one()
    finally:
        net.down()
        shutil.rmtree(ram, ignore_errors=True)
    print_table(rows, trees)
    print(f"runs that did not pass kept in {tmp}")
    return 0


def print_table(rows: list[tuple[str, str, str, float]], trees: dict[str, Path]) -> None:
    minutes = sum(r[3] for r in rows) / 60
    code = ", ".join(f"{name} {trees[name]}" for name in trees)
    print(f"\n{len(rows)} runs in {minutes:.1f} min; code: {code}\n")
    print("| code | schedules | run | passed | other bits | samples twice or never | failed | share |")
    print("|---|---|---|---|---|---|---|---|")
    for name in trees:
        for kind in sorted({r[1] for r in rows}) + ["all"]:
            mine = [r for r in rows if r[0] == name and kind in ("all", r[1])]
            n = Counter(r[2] for r in mine)
            share = n["passed"] / len(mine) if mine else 0.0
            print(
                f"| {name} | {kind} | {len(mine)} | {n['passed']} | {n['other bits']} | {n['samples']} "
                f"| {n['failed']} | {share:.0%} |"
            )


if __name__ == "__main__":
    sys.exit(main())
