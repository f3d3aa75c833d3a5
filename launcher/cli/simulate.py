"""``sres simulate``: what our measured recovery costs mean for a job of thousands of GPUs (a model)."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from launcher.cli.arg_types import finite_float
from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.simulate import (
    LLAMA3_FAILURES_PER_NODE_HOUR,
    Costs,
    expected_inprocess,
    expected_restart,
    Job,
    Result,
    measured_costs,
    monte_carlo,
)

MAX_TRIALS = 100_000
MAX_FAILURES = 5_000_000
"""Failures simulated over all trials of one scale (each costs a few microseconds): beyond this
a typo (``--days 1e9``) would run for hours."""

ASSUMPTIONS = """\
The model (a model, not a measurement): node failures are a Poisson process at a constant rate
per node (default: the Llama 3 paper's 419 unexpected interruptions in 54 days on 16,384 H100
GPUs in 8-GPU nodes, Dubey et al. 2024, section 3.3.4: 1.58e-4 per node-hour). In-process
recovery costs RECOVERY seconds per failure without progress (from the events: fault -> first
step after it; plus --detection-s for what a real cluster adds, e.g. a hang timeout) and redoes
the steps lost (median over the events, plus half a step interrupted); a spare is always there;
both holders of a state lost together (a persistent-tier fallback) is not modelled; training
runs slower by the steady overhead (--steady-overhead; default: the checkpoint blocking of the
events' goodput accounts). The baseline writes a blocking checkpoint every Daly-optimal
interval and restarts the job on each failure (--restart-s: requeue, scheduling, start-up,
load). Failures also strike during recoveries and restarts, which then start again.
Goodput = fault-free work / wall time."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="goodput at scale from measured recovery costs vs checkpoint/restart (a model)",
        description="Monte-Carlo goodput of a long training run at a given scale, with in-process "
        "recovery (costs measured from events.jsonl) and with restart from a checkpoint at "
        "the optimal interval (Young/Daly).",
        epilog=ASSUMPTIONS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("events", nargs="*", type=Path, help="events.jsonl of runs with faults, or their log dirs")
    p.add_argument(
        "--gpus", default="1024,4096,16384", help="GPU counts, comma-separated (default %(default)s)"
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument(
        "--failures-per-node-hour",
        type=finite_float,
        default=LLAMA3_FAILURES_PER_NODE_HOUR,
        help="node failure rate (default %(default).3g: Llama 3 paper, see below)",
    )
    p.add_argument(
        "--days", type=finite_float, default=30.0, help="fault-free length of the training run (default 30)"
    )
    _add_cost_options(p)
    p.add_argument(
        "--trials", type=int, default=200, help="simulated runs per scale and strategy (default 200)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, default=Path("sres-simulate.png"), help="where the plot goes")
    p.set_defaults(func=_cmd_simulate)


def _add_cost_options(p: argparse.ArgumentParser) -> None:
    """What each strategy pays: measured from the events unless given."""
    p.add_argument(
        "--recovery-s",
        type=finite_float,
        default=None,
        help="seconds per in-process recovery (default: the median of the events' recoveries)",
    )
    p.add_argument(
        "--detection-s", type=finite_float, default=0.0, help="seconds added to each recovery for detection"
    )
    p.add_argument(
        "--step-s", type=finite_float, default=5.0, help="seconds per training step at scale (default 5)"
    )
    p.add_argument(
        "--steady-overhead",
        type=finite_float,
        default=None,
        help="fraction of step time that commits block (default: the events' checkpoint blocking over "
        "useful step time, else 0)",
    )
    p.add_argument(
        "--ckpt-write-s",
        type=finite_float,
        default=60.0,
        help="blocking checkpoint write, baseline (default 60)",
    )
    p.add_argument(
        "--restart-s",
        type=finite_float,
        default=600.0,
        help="restart of the job from a checkpoint: requeue, scheduling, start-up, load (default 600)",
    )


def _costs(args: argparse.Namespace) -> tuple[Costs, str]:
    events = []
    for path in args.events:
        path = path / "events.jsonl" if path.is_dir() else path
        if not path.exists():
            raise ConfigError(f"{path}: no such events file")
        events += read_events(path)
    lost_steps, overhead = 0.0, args.steady_overhead
    if args.recovery_s is not None:
        recovery, source = args.recovery_s, "given"
    elif events:
        try:
            m = measured_costs(events)
        except ValueError as err:
            raise ConfigError(f"{', '.join(map(str, args.events))}: {err}") from None
        recovery, lost_steps = m.recovery_s, m.steps_lost
        if overhead is None and m.steady_overhead is not None:
            overhead = m.steady_overhead
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in m.parts.items())
        source = f"median of {m.recoveries} recoveries ({parts}), {lost_steps:g} steps lost"
    else:
        raise ConfigError("give events.jsonl of runs with faults (e.g. from sres demo) or --recovery-s")
    try:
        costs = Costs(
            recovery_s=recovery + args.detection_s,
            lost_s=(lost_steps + 0.5) * args.step_s,
            steady_overhead=overhead or 0.0,
            ckpt_write_s=args.ckpt_write_s,
            restart_s=args.restart_s,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return costs, source


def _cmd_simulate(args: argparse.Namespace) -> int:
    costs, source = _costs(args)
    try:
        scales = [int(g) for g in args.gpus.split(",")]
    except ValueError as err:
        raise ConfigError(f"--gpus {args.gpus}: {err}") from None
    try:
        jobs = [Job(g, args.gpus_per_node, args.failures_per_node_hour, args.days * 24) for g in scales]
    except ValueError as err:
        raise ConfigError(
            f"--gpus {args.gpus} --gpus-per-node {args.gpus_per_node} --failures-per-node-hour "
            f"{args.failures_per_node_hour:g} --days {args.days:g}: {err}"
        ) from None
    if not 1 <= args.trials <= MAX_TRIALS:
        raise ConfigError(f"--trials must be 1..{MAX_TRIALS} (got {args.trials})")
    for job in jobs:
        _check_size(job, costs, args.trials)
    rng = random.Random(args.seed)
    print(
        f"recovery {costs.recovery_s:.2f} s ({source}); redo {costs.lost_s:.1f} s per failure; "
        f"steady overhead {costs.steady_overhead:.2%}; "
        f"baseline: checkpoint {costs.ckpt_write_s:g} s, restart {costs.restart_s:g} s; "
        f"{args.days:g}-day runs, {args.trials} trials (a model: see sres simulate --help)"
    )
    print(
        f"{'GPUs':>6} {'MTBF':>7} {'strategy':24} {'goodput':>8} {'p5-p95':>15} {'expected':>9} "
        f"{'failures':>9}"
    )
    rows: list[tuple[Job, list[Result]]] = []
    for job in jobs:
        results = monte_carlo(job, costs, args.trials, rng)
        rows.append((job, results))
        for r in results:
            print(
                f"{job.gpus:>6} {job.mtbf_s / 3600:>6.1f}h {r.strategy:24} {r.mean:>8.2%} "
                f"{r.percentile(0.05):>7.2%}-{r.percentile(0.95):<7.2%} {r.expected:>9.2%} "
                f"{sum(r.failures) / len(r.failures):>9.0f}"
            )
    _plot(rows, args.plot)
    print(f"plot: {args.plot}")
    return 0


def _check_size(job: Job, costs: Costs, trials: int) -> None:
    """Refuse a simulation that would run for hours: the failures it must draw follow from the
    model's own expected goodput (a recovery or restart that outlasts the time between failures
    drives it to zero, and the failures to infinity)."""
    try:
        worst = min(expected_inprocess(job, costs), expected_restart(job, costs))
    except (OverflowError, ZeroDivisionError):
        worst = 0.0
    failures = job.rate_per_s * job.work_hours * 3600 / worst if worst > 0 else math.inf
    if failures * trials > MAX_FAILURES:
        raise ConfigError(
            f"{job.gpus} GPUs: about {failures:.3g} failures a run (one every {job.mtbf_s:.3g} s, "
            f"goodput {worst:.2g}) x {trials} trials, more than {MAX_FAILURES:.0e} to simulate: "
            "fewer days, GPUs or trials, a lower rate, or shorter recoveries and restarts"
        )


def _plot(rows: list[tuple[Job, list[Result]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(r.strategy for r in rows[0][1]):
        gpus = [job.gpus for job, _ in rows]
        means = [results[i].mean * 100 for _, results in rows]
        spread = [
            [(results[i].mean - results[i].percentile(0.05)) * 100 for _, results in rows],
            [(results[i].percentile(0.95) - results[i].mean) * 100 for _, results in rows],
        ]
        ax.errorbar(gpus, means, yerr=spread, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks([job.gpus for job, _ in rows], [f"{job.gpus:,}" for job, _ in rows])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("goodput (%)")
    ax.set_title("Goodput at scale (model; bars: p5-p95)")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
