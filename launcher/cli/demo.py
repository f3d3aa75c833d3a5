"""``sres demo``: checkpointless recovery, shown on a real model, checked bitwise.

Trains the example MLP (about 64 MiB of parameters and AdamW state) data-parallel on 4
simulated nodes with 1 warm spare, twice: once without faults (the reference), once with a
node killed mid-run. The second run recovers from peers' memory; the demo then compares
the final state of every rank bitwise and prints the recovery time and goodput.
:func:`add_parser` adds the subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.observability.events import read_events
from resilience.contract.run_dir import RunDir
from resilience.own_python import own_module


@dataclass(frozen=True)
class DemoConfig:
    steps: int = 60
    width: int = 1024
    depth: int = 4
    nodes: int = 4
    kill_node: int = 1
    kill_step: int = 30
    log_dir: Path = Path("sres-runs")


def _train_command(c: DemoConfig, out: Path) -> tuple[str, ...]:
    return (
        *own_module("resilience.examples.train_mlp"),
        "--steps",
        str(c.steps),
        "--width",
        str(c.width),
        "--depth",
        str(c.depth),
        "--progress-every",
        "10",
        "--out",
        str(out),
    )


def _run(c: DemoConfig, name: str, inject: tuple[str, ...], out=sys.stdout) -> tuple[bool, Path]:
    from launcher.supervisor import RunConfig, Supervisor  # here: sres loads this module for --help too
    from resilience.contract.injections import parse as parse_injections

    log_dir = c.log_dir / name
    config = RunConfig(
        command=_train_command(c, log_dir / "out"),
        nodes=c.nodes,
        spares=1,
        injections=parse_injections(inject),
        log_dir=log_dir,
        hang_timeout_s=30,
    )
    outcome = Supervisor(config, out=out).run()
    return outcome.ok, log_dir


def _final(log_dir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in (log_dir / "out").glob("rank*.json")}


def _header(c: DemoConfig) -> str:
    from resilience.examples.train_mlp import state_mb  # here: sres loads this module for --help too

    return (
        f"sres demo: MLP {c.depth + 1} x {c.width}x{c.width}, "
        f"{state_mb(c.width, c.depth):.0f} MiB of parameters + "
        f"AdamW state per rank, {c.nodes} nodes + 1 warm spare, {c.steps} steps; logs in {c.log_dir}"
    )


def main(c: DemoConfig, out=sys.stdout) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    c = DemoConfig(**{**c.__dict__, "log_dir": c.log_dir / f"demo-{stamp}"})
    print(_header(c), file=out)
    print("\n[1/2] reference run, no fault", file=out, flush=True)
    ok, ref_dir = _run(c, "reference", ())
    if not ok:
        return 1
    print(
        f"\n[2/2] same run, node {c.kill_node} killed (SIGKILL of all its processes) at step {c.kill_step}",
        file=out,
        flush=True,
    )
    ok, fault_dir = _run(c, "with-fault", (f"node:{c.kill_node}:step={c.kill_step}",))
    if not ok:
        return 1
    ref, got = _final(ref_dir), _final(fault_dir)
    identical = sorted(ref) == sorted(got) and all(ref[r]["digest"] == got[r]["digest"] for r in ref)
    events = read_events(RunDir(fault_dir).events)
    rec, finished = events.first("recovered"), events.last("finished")
    ref_finished = read_events(RunDir(ref_dir).events).last("finished")
    if rec is None or finished is None or ref_finished is None:  # both runs exited 0: our bug
        raise RuntimeError(f"sres demo: a run left no recovered/finished event in {fault_dir} or {ref_dir}")
    print("\nresult", file=out)
    print(
        f"  final loss, rank 0      reference {ref[0]['loss']:.9f}   with fault {got[0]['loss']:.9f}",
        file=out,
    )
    print(
        f"  final parameters + optimizer state bitwise identical on all {len(ref)} ranks: "
        f"{'YES' if identical else 'NO'}",
        file=out,
    )
    print(
        f"  recovery: {rec['seconds']:.2f} s from the kill to the first step after it "
        f"(release {_seconds(rec['release_s'])}, re-form {rec['reform_s']:.2f} s, state from {rec['source']} "
        f"{rec['bytes'] / 2**20:.0f} MiB in {rec['transfer_s']:.2f} s, "
        f"first step {rec['first_step_s']:.2f} s); "
        f"{rec['steps_lost']} step(s) redone",
        file=out,
    )
    if finished.get("goodput") and ref_finished.get("goodput"):
        print(
            f"  goodput: {finished['goodput']:.1%} with the fault, {ref_finished['goodput']:.1%} without",
            file=out,
        )
    return 0 if identical else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="kill a node mid-training, recover from peers, compare with a fault-free run",
        description="Train a ~64 MiB MLP on 4 simulated nodes + 1 warm spare twice, without and with "
        "a node killed mid-run; print both final losses, whether the final state is bitwise "
        "identical, the recovery time and goodput.",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--width", type=int, default=1024, help="MLP width: 1024 gives ~64 MiB of state per rank")
    p.add_argument(
        "--log-dir", default="sres-runs", help="parent folder of the demo's logs (default sres-runs)"
    )
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    return main(DemoConfig(steps=args.steps, width=args.width, log_dir=Path(args.log_dir)))


def _seconds(value: float | None) -> str:
    """``release_s`` is None when no survivor reported leaving (every rank was lost)."""
    return "-" if value is None else f"{value:.2f} s"
