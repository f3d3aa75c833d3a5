"""``sres chaos``: the same training with and without a seeded storm of faults, compared.

A soak is what convinces: hundreds of random faults in one run, and a check a user would
make themselves. It runs ``sres run`` twice with the same options and command (fault-free,
then with ``--inject random:seed=S:...:count=N``), and exits 0 only when the final state of
every rank is bit for bit the same and nothing of the run is left: no process, no RAM-tier
files, every fault followed by a recovery. The verdict and the numbers come as one table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.cli.arg_types import finite_float
from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.timeline import Event, Timeline
from launcher.run.leftovers import pid_alive, processes_with_env
from resilience.agent import fault_schedule
from resilience.contract.run_dir import RunDir
from resilience.own_python import own_module
from resilience.tiers.layout import job_ram_dir

REPAIR_AFTER_S = 0.0
"""Local runs: a drained simulated node is back at once (a soak needs more node losses
than any job has spares; on a cluster the test resumes nodes itself)."""
STEPS_LOST_BOUND = 2
"""Steps a recovery from memory (peers, RAM and neighbour tiers) may redo: the commit a fault
cut off, and with sharded state the one before, when the lost rank's buddy copy of it was cut
off too (its buddy holds only the commit before; everyone rolls back to it). Data-parallel
runs redo at most 1. A recovery from the persistent tier (every copy in memory lost or
refused) goes back to its last save: ``--persist-every`` bounds it, not this."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chaos",
        help="run a training command fault-free and under N random faults; exit 0 only if identical "
        "and clean",
        description="Runs `sres run RUN-OPTIONS -- CMD` twice: fault-free, then with a seeded random fault "
        "schedule. Compares every rank's final state digest, checks that each fault was recovered "
        "and that no process or RAM-tier file of the run is left, and prints one table. "
        "CMD must train at least as many steps as the schedule needs (printed at the start). "
        "Example: sres chaos --faults 25 --seed 1 -- --nodes 4 --spares 1 -- "
        "python -m resilience.examples.train_mlp --steps 200",
    )
    p.add_argument("--faults", type=int, default=25, help="faults to inject (default 25)")
    p.add_argument("--seed", type=int, default=None, help="schedule seed (default: from the clock; printed)")
    p.add_argument(
        "--every", type=finite_float, default=6.0, help="one fault per this many steps on average (default 6)"
    )
    p.add_argument(
        "--kinds",
        default=",".join(fault_schedule.DEFAULT_KINDS),
        help="fault kinds (default %(default)s; also "
        + ", ".join(k for k in fault_schedule.KINDS if k not in fault_schedule.DEFAULT_KINDS)
        + ": 'sres run --inject help' says what each needs and does)",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="where both runs' log dirs go (default sres-runs/chaos-<seed>)",
    )
    p.add_argument(
        "--progress-every",
        type=int,
        default=25,
        metavar="N",
        help="print a progress line every N faults seen (default 25; 0: never)",
    )
    p.add_argument(
        "run_args",
        nargs=argparse.REMAINDER,
        help="-- sres run options -- CMD (e.g. -- --nodes 4 --spares 1 -- python train.py)",
    )
    p.set_defaults(func=cmd_chaos)


@dataclass
class Verdict:
    identical: bool
    leftovers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.leftovers and not self.problems


def cmd_chaos(args: argparse.Namespace) -> int:
    run_args = list(args.run_args)[1:] if args.run_args[:1] == ["--"] else list(args.run_args)
    if "--" not in run_args or run_args.index("--") == len(run_args) - 1:
        raise ConfigError("sres chaos needs the run: sres chaos [--faults N] -- RUN-OPTIONS -- CMD")
    if any(a.startswith(("--inject", "--log-dir", "--job-id")) for a in run_args[: run_args.index("--")]):
        raise ConfigError("sres chaos sets --inject, --log-dir and --job-id of its runs itself")
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    spec = fault_schedule.RandomFaults(
        seed, args.every, tuple(args.kinds.split(",")), 1, 1_000_000, args.faults
    )
    base = args.log_dir or Path("sres-runs") / f"chaos-{seed}"
    print(
        f"sres chaos: seed {seed}, {args.faults} faults, log dirs under {base}", file=sys.stderr, flush=True
    )
    persistent = _option(run_args[: run_args.index("--")], "--persistent-dir")
    run_args = _with_soak_defaults(run_args, args.faults)
    runs = {}
    for name, extra in (("reference", []), ("chaos", ["--inject", spec.spec])):
        log_dir = base / name
        job = f"chaos-{seed}-{name}-{time.monotonic_ns() % 10**9}"
        if (
            persistent
        ):  # a run of its own each: the chaos run must not resume from the reference's checkpoints
            extra = [*extra, "--persistent-dir", str(Path(persistent) / name)]
        argv = [
            *own_module("launcher.cli"),
            "run",
            "--log-dir",
            str(log_dir),
            "--job-id",
            job,
            *extra,
            *_without(run_args, "--persistent-dir"),
        ]
        if name == "chaos" and runs["reference"][0] == 0:
            refuse_faults_past_the_end(spec, _events(runs["reference"][1]))
        print(f"sres chaos: {name} run ...", file=sys.stderr, flush=True)
        runs[name] = (_run(argv, log_dir, args.progress_every if name == "chaos" else 0), log_dir, job)
    verdict, table = judge(runs, str(Path(persistent) / "chaos") if persistent else None)
    print(table)
    return 0 if verdict.identical and verdict.clean else 1


def refuse_faults_past_the_end(spec: fault_schedule.RandomFaults, reference: Timeline) -> None:
    """Refuse, before the run with faults, a schedule whose faults fall after the run's last step:
    they would never fire, and a verdict on fewer faults than asked would read "clean" (the
    guide's 25 faults over a 100-step run: 22 happened). The fault-free run says how many steps
    the command trains and how many ranks it has, which the schedule's steps depend on."""
    start, finished = reference.last("start"), reference.last("finished")
    if start is None or finished is None:
        return
    steps = int(finished["steps"])
    schedule = fault_schedule.expand(spec, world_size=int(start["world_size"]))
    late = [i for i in schedule if i.step >= steps]
    if not late:
        return
    raise ConfigError(
        f"{len(late)} of the chaos schedule's {len(schedule)} injections fall after the run's last "
        f"step ({steps - 1}; they reach step {max(i.step for i in schedule)}) and would never fire: ask "
        f"for fewer faults than {spec.count}, a smaller --every than {spec.every:g}, or more steps"
    )


def _with_soak_defaults(run_args: list[str], faults: int) -> list[str]:
    """The run's options, with what a soak needs where the user set nothing."""
    options = run_args[: run_args.index("--")]
    added = []
    if not any(a.startswith("--max-restarts") for a in options):
        added += ["--max-restarts", str(2 * faults + 10)]  # every fault is a restart
    if not any(a.startswith("--node-fault-after") for a in options):
        # The schedule's process faults are independent by construction: draining their nodes
        # would test the drain rule a few hundred times and throw away the RAM tier of healthy
        # nodes. Node losses are scheduled as such (kind node).
        added += ["--node-fault-after", str(10 * faults + 10)]
    if not any(a.startswith("--standby") for a in options):
        added += ["--standby", "1"]  # a killed or hung rank's node has a warm process to take over
    on_slurm = "slurm" in options or (os.environ.get("SLURM_JOB_ID") and "local" not in options)
    if not on_slurm and not any(a.startswith("--repair-after") for a in options):
        added += ["--repair-after", str(REPAIR_AFTER_S)]  # lost nodes come back, as on a cluster
    return added + run_args


def _run(argv: list[str], log_dir: Path, progress_every: int) -> int:
    """Run one ``sres run`` to its end; every ``progress_every`` faults, say how it goes."""
    proc = subprocess.Popen(argv)
    shown = 0
    while proc.poll() is None:
        time.sleep(0.5)
        if not progress_every or not RunDir(log_dir).events.exists():
            continue
        events = read_events(RunDir(log_dir).events)
        faults = events.count("fault")
        if faults // progress_every > shown // progress_every:
            shown = faults
            seconds = sorted(e["seconds"] for e in events.of("recovered"))
            p50 = f", recovery p50 {_pct(seconds, 50):.2f} s" if seconds else ""
            print(
                f"sres chaos: {faults} faults seen, {len(seconds)} recoveries{p50}",
                file=sys.stderr,
                flush=True,
            )
    return proc.returncode


def _without(argv: list[str], name: str) -> list[str]:
    """``argv`` less option ``name`` and its value, in the run's options (before the ``--``)."""
    cut = argv.index("--")
    options, out, skip = argv[:cut], [], False
    for option in options:
        if skip:
            skip = False
        elif option == name:
            skip = True
        elif not option.startswith(name + "="):
            out.append(option)
    return out + argv[cut:]


def _option(options: list[str], name: str) -> str | None:
    for i, option in enumerate(options):
        if option == name and i + 1 < len(options):
            return options[i + 1]
        if option.startswith(name + "="):
            return option.split("=", 1)[1]
    return None


def _events(log_dir: Path) -> Timeline:
    """The run's events (none when it left no events file)."""
    path = RunDir(log_dir).events
    return read_events(path) if path.exists() else Timeline()


def judge(runs: dict[str, tuple[int, Path, str]], persistent_dir: str | None = None) -> tuple[Verdict, str]:
    """The verdict on the two runs, and the table that shows it."""
    (ref_rc, ref_dir, _), (rc, log_dir, job) = runs["reference"], runs["chaos"]
    ref_events, events = _events(ref_dir), _events(log_dir)
    expected, got = _digests(ref_events), _digests(events)
    verdict = Verdict(identical=ref_rc == 0 and rc == 0 and bool(expected) and expected == got)
    if ref_rc != 0:
        verdict.problems.append(f"the fault-free run failed (exit {ref_rc}): see {ref_dir}")
    if rc != 0:
        verdict.problems.append(f"the run with faults failed (exit {rc}): see {log_dir}")
    for d in (ref_dir, log_dir):
        alive = [p for p in processes_with_env(f"SRES_LOG_DIR={d.resolve()}") if pid_alive(p)]
        if alive:
            verdict.leftovers.append(f"processes {alive} of {d}")
    if job_ram_dir(job).exists():
        verdict.leftovers.append(f"RAM-tier files {job_ram_dir(job)}")
    fillers = sorted(Path(persistent_dir).glob(".sres-fill-disk-*")) if persistent_dir else []
    if fillers:  # the run ended before the disk was freed: free it, and say so
        for path in fillers:
            path.unlink(missing_ok=True)
        verdict.leftovers.append(
            f"a full disk ({', '.join(p.name for p in fillers)}): the run ended before free-disk"
        )
    faults = events.of("fault")
    recovered = list({e["generation"]: e for e in events.of("recovered")}.values())  # one per generation
    unanswered = [f for f in faults if not any(r["generation"] > f["generation"] for r in recovered)]
    if unanswered and rc == 0:
        f = unanswered[0]
        verdict.problems.append(
            f"{len(unanswered)} fault(s) without a recovery after them, the first: {f['kind']} "
            f"of rank {f['rank']} in generation {f['generation']}"
        )
    lost = max((r["steps_lost"] for r in recovered if r["source"] != "persistent"), default=0)
    if lost > STEPS_LOST_BOUND:
        verdict.problems.append(f"a recovery from memory redid {lost} steps (bound {STEPS_LOST_BOUND})")
    return verdict, _table(events, faults, recovered, verdict, log_dir)


def _digests(events: Timeline) -> dict[str, str]:
    finished = events.last("finished")
    return finished.get("state_digests", {}) if finished else {}


def _table(
    events: Timeline, faults: list[Event], recovered: list[Event], verdict: Verdict, log_dir: Path
) -> str:
    kinds: dict[str, int] = {}
    for f in faults:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    seconds = sorted(r["seconds"] for r in recovered)
    finished = events.last("finished")
    path = RunDir(log_dir).fault_schedule
    schedule = json.loads(path.read_text()) if path.exists() else {"injections": []}
    lines = [
        f"{'faults injected':<22} {len(schedule['injections'])}",
        f"{'faults seen':<22} {len(faults)} "
        f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or '-'})",
        f"{'recovered':<22} {len(recovered)}",
    ]
    if seconds:
        lines.append(f"{'recovery s p50/p90/p99':<22} {_percentiles(seconds)}")
        for kind, values in sorted(_recovery_by_kind(events).items()):
            lines.append(f"{'  after ' + kind:<22} {_percentiles(values)}")
        lost = {
            persistent: max(
                (r["steps_lost"] for r in recovered if (r["source"] == "persistent") == persistent),
                default=None,
            )
            for persistent in (False, True)
        }
        lines.append(
            f"{'steps lost max':<22} {lost[False] if lost[False] is not None else '-'} from memory"
            + (f", {lost[True]} from the persistent tier" if lost[True] is not None else "")
        )
    invalid = events.of("checkpoint-invalid")
    lines.append(
        f"{'bad copies refused':<22} {len(invalid)}"
        + (f" ({', '.join(sorted({e['tier'] for e in invalid}))})" if invalid else "")
    )
    if finished:
        lines.append(
            f"{'goodput':<22} {_share(finished['goodput'])} over {finished['wall_s']:.0f} s, "
            f"{finished['steps']} steps"
        )
    lines.append(f"{'identical':<22} {'yes' if verdict.identical else 'NO'}")
    lines.append(
        f"{'clean':<22} "
        f"{'yes' if verdict.clean else 'NO: ' + '; '.join(verdict.leftovers + verdict.problems)}"
    )
    return "\n".join(lines)


def _recovery_by_kind(events: Timeline) -> dict[str, list[float]]:
    """Recovery seconds by the kind of fault they answered (a recovery after several
    faults counts for each kind among them)."""
    out: dict[str, list[float]] = {}
    pending: set[str] = set()
    answered: set[int] = set()
    for e in events:
        if e.is_("fault"):
            pending.add(e["kind"])
        elif e.is_("recovered") and e["generation"] not in answered:
            answered.add(e["generation"])
            for kind in pending:
                out.setdefault(kind, []).append(e["seconds"])
            pending = set()
    return out


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    return (
        f"{_pct(values, 50):.2f} / {_pct(values, 90):.2f} / {_pct(values, 99):.2f} "
        f"(max {values[-1]:.2f}, n={len(values)})"
    )


def _pct(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _share(goodput: float | None) -> str:
    """The ``finished`` event's goodput is None when no step time was measured."""
    return "-" if goodput is None else f"{goodput:.1%}"
