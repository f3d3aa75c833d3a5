"""``sres simulate``: what our measured recovery costs mean for a job of thousands of GPUs (a model).

The model is :mod:`launcher.observability.goodput_model` (its strategies, presets, inputs from
events and sensitivity in the ``goodput_*`` modules next to it); this module reads the options,
checks that the run is not too large to simulate, and prints the tables. The control path's
growth with ranks comes from a measured curve (``--control-curve``, default the one shipped in
the package, :mod:`launcher.observability.goodput_scale`): a line per scale says what it adds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from pathlib import Path

from launcher.cli.arg_types import finite_float
from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.goodput_inputs import DEFAULT_SOURCES, measured_ladder
from launcher.observability.goodput_model import PARTS, RUNGS, SimulatedJob, Result, expected, simulate
from launcher.observability.goodput_presets import PRESETS, Preset, preset_work_hours
from launcher.observability.goodput_scale import DEFAULT_CURVE, ControlCurve, load_curve
from launcher.observability.goodput_sensitivity import tornado
from launcher.observability.goodput_strategies import Ladder, Restart
from resilience.contract.run_dir import RunDir

MAX_TRIALS = 100_000
MAX_FAILURES = 5_000_000
"""Failures simulated over all trials of one scale (each costs a few microseconds): beyond this
a typo (``--days 1e9``) would run for hours."""

ASSUMPTIONS = """\
The model (a model, not a measurement; docs/guide/reports.md has it in full, with sources):
failures are a Poisson process in wall time, per node at the preset's rate (default llama3: 419
unexpected interruptions in 54 days on 16,384 GPUs in 8-GPU servers, and 47 planned ones), of
the preset's kinds (a process, a hang, one node, a switch taking two nodes). Our ladder: a
process fault or a hang is recovered in-process (a hang seen after --hang-timeout-s); a lost node
is taken over by a warm spare if the pool (--spares, refilled in --refill-s) has one, else by a
node from the scheduler (--node-wait-s, exponential, plus its start-up) while the world runs one
node short (elastic) or waits (--no-elastic); a switch taking a state's both holders costs a
restore from the persistent tier (--persistent-s, and the work since its last save, every
--persist-interval-s); the job's batch host lost costs a requeue (--requeue-s). The baseline
restarts the whole job on every failure (--restart-s, after --detection of the preset) and
writes a blocking checkpoint (--ckpt-write-s) every Daly-optimal interval. A failure during a
recovery starts a new one. Goodput = fault-free work / wall time. Our costs are measured at a
few ranks: an in-process recovery and a spare's takeover also pay what the control path (kill ->
every survivor released into the new generation) costs at the job's ranks beyond that, from a
line fitted over the curve --control-curve measured (beyond its scales: extrapolated)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="goodput at scale from measured recovery costs vs checkpoint/restart (a model)",
        description="Monte-Carlo goodput of a long training run at scale: our recovery ladder (costs "
        "measured from events.jsonl, or this machine's benchmarks) against a restart from a checkpoint, "
        "calibrated on a published run (--preset); a table per scale, the lost time by rung, and which "
        "input moves our goodput most.",
        epilog=ASSUMPTIONS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("events", nargs="*", type=Path, help="events.jsonl of runs with faults, or their log dirs")
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="llama3", help="published run (default llama3)"
    )
    p.add_argument(
        "--gpus", default="1024,4096,16384", help="GPU counts, comma-separated (default %(default)s)"
    )
    p.add_argument("--gpus-per-node", type=int, default=None, help="default: the preset's")
    p.add_argument(
        "--failures-per-node-hour", type=finite_float, default=None, help="default: the preset's rate"
    )
    p.add_argument("--planned-per-day", type=finite_float, default=None, help="default: the preset's")
    p.add_argument(
        "--days", type=finite_float, default=30.0, help="fault-free length of the run (default 30)"
    )
    p.add_argument("--step-s", type=finite_float, default=5.0, help="seconds per step at scale (default 5)")
    _add_ladder_options(p)
    p.add_argument(
        "--control-curve",
        type=Path,
        default=None,
        metavar="PATH",
        help="the control path's seconds against ranks, measured by benchmarks/control_plane.py "
        "(default: the curve shipped in the package, measured on the development machine)",
    )
    p.add_argument("--ckpt-write-s", type=finite_float, default=None, help="baseline's blocking write")
    p.add_argument("--restart-s", type=finite_float, default=None, help="baseline's restart of the job")
    p.add_argument(
        "--trials", type=int, default=200, help="simulated runs per scale and strategy (default 200)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, default=None, help="write a plot of goodput vs scale here (PNG)")
    p.set_defaults(func=_cmd_simulate)


LADDER_OPTIONS = {
    "--recovery-s": ("inprocess_s", "an in-process recovery and a spare's takeover"),
    "--detection-s": ("detect_s", "a dead process or node seen (liveness)"),
    "--hang-timeout-s": ("hang_timeout_s", "a hang seen"),
    "--refill-s": ("refill_s", "mean time to refill the spare pool"),
    "--node-wait-s": ("node_wait_s", "mean scheduler wait for a node when no spare is free"),
    "--node-start-s": ("node_start_s", "a new node's start-up"),
    "--persistent-s": ("persistent_s", "a restore from the persistent tier"),
    "--persist-interval-s": ("persist_interval_s", "work between persistent saves"),
    "--requeue-s": ("requeue_s", "a requeue of the job (its batch host lost)"),
    "--steady-overhead": ("steady_overhead", "share of step time commits block (default: measured)"),
}


def _add_ladder_options(p: argparse.ArgumentParser) -> None:
    for flag, (field, what) in LADDER_OPTIONS.items():
        default = getattr(Ladder(), field)
        p.add_argument(
            flag, type=finite_float, default=None, help=f"{what} (default: measured, else {default:g})"
        )
    p.add_argument("--spares", type=int, default=None, help="warm spare nodes (default: 1 per 256 nodes)")
    p.add_argument("--no-elastic", action="store_true", help="wait for a node instead of going on without it")


def _ladder(args: argparse.Namespace) -> tuple[Ladder, dict[str, str]]:
    """Measured from the events, then the options on top."""
    events = []
    for path in args.events:
        path = RunDir(path).events if path.is_dir() else path
        if not path.exists():
            raise ConfigError(f"{path}: no such events file")
        events += read_events(path)
    ladder, sources = Ladder(), dict(DEFAULT_SOURCES)
    if events:
        try:
            ladder, sources = measured_ladder(events, ladder)
        except ValueError as err:
            raise ConfigError(f"{', '.join(map(str, args.events))}: {err}") from None
    given: dict[str, object] = {}
    for flag, (field, _what) in LADDER_OPTIONS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            given[field] = value
            sources[field] = f"given ({flag})"
    if args.recovery_s is not None:
        given["spare_s"], sources["spare_s"] = args.recovery_s, "given (--recovery-s)"
    given.update(elastic=not args.no_elastic, **({"spares": args.spares} if args.spares is not None else {}))
    try:
        return dataclasses.replace(ladder, **given), sources
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _preset(args: argparse.Namespace) -> tuple[Preset, Restart]:
    preset = PRESETS[args.preset]
    changes = {
        k: v for k, v in (("ckpt_write_s", args.ckpt_write_s), ("restart_s", args.restart_s)) if v is not None
    }
    try:
        return preset, dataclasses.replace(preset.baseline, **changes)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _jobs(args: argparse.Namespace, preset: Preset) -> list[SimulatedJob]:
    try:
        scales = [int(g) for g in args.gpus.split(",")]
    except ValueError as err:
        raise ConfigError(f"--gpus {args.gpus}: {err}") from None
    base = preset.job
    fields = {
        "gpus_per_node": args.gpus_per_node if args.gpus_per_node is not None else base.gpus_per_node,
        "failures_per_node_hour": args.failures_per_node_hour
        if args.failures_per_node_hour is not None
        else base.failures_per_node_hour,
        "planned_per_day": args.planned_per_day if args.planned_per_day is not None else base.planned_per_day,
        "work_hours": args.days * 24,
        "step_s": args.step_s,
    }
    try:
        return [SimulatedJob(gpus=g, **fields) for g in scales]
    except ValueError as err:
        raise ConfigError(f"--gpus {args.gpus}: {err}") from None


def _cmd_simulate(args: argparse.Namespace) -> int:
    if not 1 <= args.trials <= MAX_TRIALS:
        raise ConfigError(f"--trials must be 1..{MAX_TRIALS} (got {args.trials})")
    ladder, sources = _ladder(args)
    curve = load_curve(args.control_curve or DEFAULT_CURVE)
    ladder = dataclasses.replace(ladder, control_path=curve.fit())
    preset, baseline = _preset(args)
    jobs = _jobs(args, preset)
    for job in jobs:
        _check_size(job, (ladder, baseline), preset, args.trials)
    rng = random.Random(args.seed)
    _print_calibration(preset, baseline, args.trials, rng)
    _print_inputs(ladder, sources, jobs[0])
    _print_control_path(curve, ladder, sources, jobs)
    rows = [
        (job, [simulate(s, job, preset.mix, args.trials, rng) for s in (baseline, ladder)]) for job in jobs
    ]
    _print_table(rows, args)
    _print_tornado(ladder, jobs[-1], preset)
    if args.plot is not None:
        try:
            _plot(rows, args.plot)
        except OSError as err:
            raise ConfigError(f"--plot {args.plot}: {err.strerror or err}") from None
        except ValueError as err:  # matplotlib: a suffix that is no image format
            raise ConfigError(f"--plot {args.plot}: {err}") from None
        print(f"plot: {args.plot}")
    return 0


def _check_size(job: SimulatedJob, strategies: tuple[Ladder, Restart], preset: Preset, trials: int) -> None:
    """Refuse a simulation that would run for hours: the failures it must draw follow from the
    model's own expected goodput (a recovery that outlasts the time between failures drives it
    to zero, and the failures to infinity)."""
    try:
        worst = min(expected(s, job, preset.mix) for s in strategies)
    except (OverflowError, ZeroDivisionError):
        worst = 0.0
    failures = job.rate_per_s * job.work_hours * 3600 / worst if worst > 0 else math.inf
    if failures * trials > MAX_FAILURES:
        raise ConfigError(
            f"{job.gpus} GPUs: about {failures:.3g} failures a run (one every {1 / job.rate_per_s:.3g} s, "
            f"goodput {worst:.2g}) x {trials} trials, more than {MAX_FAILURES:.0e} to simulate: "
            "fewer days, GPUs or trials, a lower rate, or shorter recoveries and restarts"
        )


def _print_calibration(preset: Preset, baseline: Restart, trials: int, rng: random.Random) -> None:
    job = dataclasses.replace(
        preset.job, work_hours=preset_work_hours(preset, expected(baseline, preset.job, preset.mix))
    )
    result = simulate(baseline, job, preset.mix, trials, rng)
    low, high = preset.tolerance
    verdict = "within" if low <= result.mean <= high else "OUTSIDE"
    unexpected = result.failures(("process", "hang", "node", "correlated"))
    print(f"preset {preset.name}: {preset.title}")
    print(
        f"  restart from checkpoint, as published: model {result.mean:.1%} (p5-p95 "
        f"{result.percentile(0.05):.1%}-{result.percentile(0.95):.1%}), published {preset.published:.0%}: "
        f"{verdict} the tolerance {low:.1%}-{high:.1%}; {unexpected:.0f} unexpected and "
        f"{result.failures(('planned',)):.0f} planned interruptions in {preset.days:g} days "
        f"(sources: sres simulate --help, docs/guide/reports.md)"
    )


def _print_inputs(ladder: Ladder, sources: dict[str, str], job: SimulatedJob) -> None:
    spares = f"{ladder.pool(job)}" if ladder.spares is not None else "1 per 256 nodes"
    print(
        f"our ladder: in-process {ladder.inprocess_s:.2f} s ({sources['inprocess_s']}); "
        f"spare {ladder.spare_s:.2f} s ({sources['spare_s']}); new node start-up {ladder.node_start_s:.2f} s "
        f"({sources['node_start_s']}); detection {ladder.detect_s:g} s, hang {ladder.hang_timeout_s:g} s; "
        f"spares {spares}, refilled in {ladder.refill_s:g} s; scheduler wait {ladder.node_wait_s:g} s; "
        f"{'elastic' if ladder.elastic else 'waits for a node'}; persistent tier {ladder.persistent_s:g} s "
        f"every {ladder.persist_interval_s:g} s; requeue {ladder.requeue_s:g} s; "
        f"{ladder.lost_steps:g} steps lost ({sources['lost_steps']}); steady overhead "
        f"{ladder.steady_overhead:.2%} ({sources['steady_overhead']})"
    )


def _print_control_path(
    curve: ControlCurve, ladder: Ladder, sources: dict[str, str], jobs: list[SimulatedJob]
) -> None:
    """One line per scale: the control path there, how the curve knows it, and what it adds to
    the recoveries measured at a few ranks."""
    line = curve.fit()
    low, high = curve.points[0].ranks, curve.points[-1].ranks
    print(
        f"control path (kill -> every survivor released into the new generation): "
        f"{line.intercept_s:.3g} s + {line.growth_per_1000_s:.3g} s per 1,000 ranks, a line fitted over the "
        f"{len(curve.points)} scales of {low:,}-{high:,} ranks measured on {curve.machine}, "
        f"{curve.measured}; "
        f"our costs measured at {ladder.measured_ranks} ranks ({sources['measured_ranks']})"
    )
    for job in jobs:
        at = curve.at(job.gpus)
        span = f"the curve's {low:,}-{high:,} ranks"
        where = {"measured": f"measured (a point of {span})", "interpolated": f"interpolated within {span}"}
        how = where.get(at.how, f"extrapolated {'below' if job.gpus < low else 'beyond'} {span}")
        print(
            f"  {job.gpus:>6,} GPUs: control path {at.seconds:.2f} s, {how}: "
            f"+{ladder.control_extra_s(job):.2f} s on each in-process recovery and spare takeover"
        )


def _print_table(rows: list[tuple[SimulatedJob, list[Result]]], args: argparse.Namespace) -> None:
    print(f"\n{args.days:g}-day runs, {args.trials} trials each; lost: % of wall time, by rung")
    rungs = [r for r in RUNGS if any(res.lost_share().get(r) for _, results in rows for res in results)]
    head = " ".join(f"{r:>10}" for r in [*rungs, "steady"])
    print(f"{'GPUs':>6} {'MTBF':>6} {'strategy':24} {'goodput':>8} {'p5-p95':>13} {'failures':>8} {head}")
    for job, results in rows:
        for r in results:
            lost = r.lost_share()
            cells = " ".join(f"{lost.get(k, 0.0):>10.3%}" for k in [*rungs, "steady"])
            print(
                f"{job.gpus:>6} {job.mtbf_s / 3600:>5.1f}h {r.strategy:24} {r.mean:>8.2%} "
                f"{r.percentile(0.05):>6.2%}-{r.percentile(0.95):<6.2%} {r.failures():>8.0f} {cells}"
            )
    print("\nthe same lost time by cause: % of wall time")
    print(f"{'GPUs':>6} {'strategy':24} " + " ".join(f"{c:>10}" for c in (*PARTS, "steady")))
    for job, results in rows:
        for r in results:
            parts = {**r.lost_by_part(), "steady": r.lost_share().get("steady", 0.0)}
            print(
                f"{job.gpus:>6} {r.strategy:24} "
                + " ".join(f"{parts.get(c, 0.0):>10.3%}" for c in (*PARTS, "steady"))
            )


def _print_tornado(ladder: Ladder, job: SimulatedJob, preset: Preset) -> None:
    base = expected(ladder, job, preset.mix)
    print(
        f"\nwhat moves our goodput at {job.gpus:,} GPUs (closed form {base:.3%}; each input halved, doubled)"
    )
    print(f"{'input':24} {'low':>10} {'goodput':>9} {'high':>10} {'goodput':>9} {'swing':>8}")
    for row in tornado(ladder, job, preset.mix)[:10]:
        print(
            f"{row.name:24} {row.low:>10.4g} {row.goodput_low:>9.3%} {row.high:>10.4g} "
            f"{row.goodput_high:>9.3%} {row.swing:>8.3%}"
        )


def _plot(rows: list[tuple[SimulatedJob, list[Result]]], path: Path) -> None:
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
