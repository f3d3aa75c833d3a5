"""``sres ckpt ls|verify DIR`` and the tier flags of ``sres run`` (a contract: code outside
the project calls them).

``ls`` lists the checkpoints of a tier directory (step, world size, size, complete or not);
``verify`` checks every checksum of every rank, says "ok" for a step only when every rank's
copy is good, and exits 1 naming each bad file, or in one line when the directory holds no
checkpoint at all. A step written by ``TieredStorageWriter`` (DCP's files beside the step's
manifests, no ``rank-R`` directories: the tier's ``dcp`` directory) is checked as DCP loads it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from launcher.errors import ConfigError
from launcher.privileges import call_as
from resilience.errors import CheckpointInvalid
from resilience.tiers import TierConfig
from resilience.tiers import checkpoint_dirs as dirs


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ckpt",
        help="list and verify tiered checkpoints",
        description="Inspect a checkpoint tier directory (the persistent directory, or a RAM-tier "
        "root such as /dev/shm/sres-<uid>/job-J/node-N/own).",
    )
    ckpt = p.add_subparsers(dest="ckpt_command", metavar="ACTION", required=True)
    ls = ckpt.add_parser("ls", help="list checkpoints: step, world size, size, complete or not")
    ls.add_argument("dir", type=Path)
    ls.set_defaults(func=_cmd_ls)
    verify = ckpt.add_parser(
        "verify", help="check every checksum; exit 1 naming each bad file, or when there is nothing to check"
    )
    verify.add_argument("dir", type=Path)
    verify.add_argument("--step", type=int, default=None, help="only this step (default: every step)")
    verify.set_defaults(func=_cmd_verify)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The tier flags alone (kept for code outside the project; ``sres run`` adds them with every
    other option from their declarations)."""
    from launcher.cli import run_options

    run_options.add_supervision_options(p, lambda spec: spec.rank == "tiers")


def tier_config(args: argparse.Namespace, log_dir: Path) -> TierConfig | None:
    """The run's TierConfig from the flags: RAM and neighbour tiers on by default (kept for code
    outside the project; ``launcher.run.configs.tier_config`` is the one that runs)."""
    from launcher.run import configs

    return configs.tier_config(args, log_dir, os.environ)  # type: ignore[arg-type]  # RunOptions' names


def _rows(root: Path) -> list[tuple[int, int | None, int, bool, str]]:
    rows = []
    for step in dirs.steps_in(root):
        ranks = dirs.ranks_in(root, step)
        size, world, why = 0, None, ""
        for rank in ranks:
            path = dirs.rank_dir(root, step, rank)
            size += sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            try:
                m = dirs.read_manifest(path)
                world = m.world_size
            except CheckpointInvalid as err:
                why = why or str(err)
        complete = not why and world is not None and ranks == list(range(world))
        if not why and not complete:
            why = f"ranks present {ranks}, world size {world}"
        rows.append((step, world, size, complete, why))
    return rows


def _cmd_ls(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():
        raise ConfigError(f"{args.dir}: no such directory")
    rows = _rows(args.dir)
    print(f"{'step':>8}  {'world':>5}  {'size MiB':>10}  status")
    for step, world, size, complete, why in rows:
        print(
            f"{step:>8}  {world if world is not None else '?':>5}  {size / 2**20:>10.1f}  "
            f"{'complete' if complete else 'INCOMPLETE: ' + why}"
        )
    if not rows:
        print("(no checkpoints)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    steps = _steps_of(args.dir)
    if args.step is not None:
        if args.step not in steps:
            raise ConfigError(f"no checkpoint of step {args.step} in {args.dir}")
        steps = [args.step]

    def check() -> int:
        bad = sum(not _verify_step(args.dir, step) for step in steps)
        sys.stdout.flush()  # a child's (below) own buffers: it ends with os._exit
        sys.stderr.flush()
        return bad

    # Root checks a user's directory as that user: files only that user wrote are read as
    # theirs, another's are refused as they would be for a run (tier_file.check_writer).
    sys.stdout.flush()
    sys.stderr.flush()
    return 1 if call_as(args.dir.stat().st_uid, check) else 0


def _steps_of(root: Path) -> list[int]:
    """The steps of a tier directory; one line (ConfigError) when it is not one: a verify that
    finds nothing to check must not pass."""
    if not root.is_dir():
        raise ConfigError(f"{root}: no such directory")
    steps = dirs.steps_in(root)
    if not steps:
        try:  # none, or none that could be listed: say which
            os.listdir(root)
        except OSError as err:
            raise ConfigError(f"{root}: cannot be read ({err.strerror})") from None
        raise ConfigError(
            f"{root}: no checkpoints in it (no step-<S> directory): not a tier directory, or an empty one"
        )
    return steps


def _verify_step(root: Path, step: int) -> bool:
    """Every rank's copy of ``step`` checked, each bad one named; "ok" only when all are good
    and every rank of the world is there."""
    from resilience.tiers import manifest  # torch: not for every ``sres`` command's start

    ranks = dirs.ranks_in(root, step)
    if not ranks and (dirs.step_dir(root, step) / dirs.MANIFEST).exists():
        return _verify_dcp_step(root, step)
    worlds, bad = set(), 0
    for rank in ranks:
        path = dirs.rank_dir(root, step, rank)
        try:
            m = dirs.read_manifest(path)
            worlds.add(m.world_size)
            manifest.verify(path, m)
        except CheckpointInvalid as err:
            print(f"BAD step {step} rank {rank}: {err}", file=sys.stderr)
            bad += 1
    if len(worlds) > 1:
        print(
            f"BAD step {step}: its ranks' manifests disagree on the world size {sorted(worlds)}",
            file=sys.stderr,
        )
        return False
    world = worlds.pop() if worlds else None
    if not ranks or (world is not None and ranks != list(range(world))):
        print(f"BAD step {step}: ranks present {ranks}, the manifests say {world}", file=sys.stderr)
        return False
    if bad:
        return False
    print(f"ok  step {step}: {len(ranks)} rank(s), every checksum matches")
    return True


def _verify_dcp_step(root: Path, step: int) -> bool:
    from resilience.tiers.dcp import verify_dcp_checkpoint

    try:
        top = verify_dcp_checkpoint(dirs.step_dir(root, step))
    except CheckpointInvalid as err:
        print(f"BAD step {step} (DCP): {err}", file=sys.stderr)
        return False
    print(f"ok  step {step} (DCP): {top.world_size} rank(s), every checksum matches")
    return True
