"""``sres ckpt ls|verify DIR`` and the tier flags of ``sres run`` (a contract: code outside
the project calls them).

``ls`` lists the checkpoints of a tier directory (step, world size, size, complete or not);
``verify`` checks every checksum and exits 1 naming the first bad file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from launcher.errors import ConfigError
from resilience.tiers import manifest as mf
from resilience.tiers import TierConfig


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
    verify = ckpt.add_parser("verify", help="check every checksum; exit 1 naming the bad file")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--step", type=int, default=None, help="only this step (default: every step)")
    verify.set_defaults(func=_cmd_verify)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--persistent-dir", help="persistent checkpoint tier (shared filesystem); off by default")
    p.add_argument(
        "--persist-every",
        type=int,
        default=None,
        metavar="K",
        help="write every K-th commit to --persistent-dir (default 10 when it is given)",
    )
    p.add_argument(
        "--job-id",
        help="files the RAM/persistent tiers under this id; a new run with the same id "
        "restores from them (default: SLURM_JOB_ID, else derived from --log-dir)",
    )
    p.add_argument(
        "--ram-every",
        type=int,
        default=None,
        metavar="N",
        help="RAM and neighbour tiers every N-th step (default 1: every commit)",
    )
    p.add_argument("--tier-config", type=Path, help="YAML file of tier settings (flags win)")
    p.add_argument("--no-tiers", action="store_true", help="no checkpoint tiers at all (peers' memory only)")


def tier_config(args: argparse.Namespace, log_dir: Path) -> TierConfig | None:
    """The run's TierConfig from the flags: RAM and neighbour tiers on by default (kept for code
    outside the project; ``launcher.run.configs.tier_config`` is the one that runs)."""
    from launcher.run import configs

    return configs.tier_config(args, log_dir, os.environ)  # type: ignore[arg-type]  # RunOptions' names


def _rows(root: Path) -> list[tuple[int, int | None, int, bool, str]]:
    rows = []
    for step in mf.steps_in(root):
        ranks = mf.ranks_in(root, step)
        size, world, why = 0, None, ""
        for rank in ranks:
            path = mf.rank_dir(root, step, rank)
            size += sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            try:
                m = mf.read_manifest(path)
                world = m.world_size
            except mf.CheckpointInvalid as err:
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
    if not args.dir.is_dir():
        raise ConfigError(f"{args.dir}: no such directory")
    steps = mf.steps_in(args.dir) if args.step is None else [args.step]
    if args.step is not None and args.step not in mf.steps_in(args.dir):
        print(f"sres: error: no checkpoint of step {args.step} in {args.dir}", file=sys.stderr)
        return 1
    bad = 0
    for step in steps:
        ranks = mf.ranks_in(args.dir, step)
        for rank in ranks:
            path = mf.rank_dir(args.dir, step, rank)
            try:
                m = mf.read_manifest(path)
                mf.verify(path, m)
            except mf.CheckpointInvalid as err:
                print(f"BAD step {step} rank {rank}: {err}", file=sys.stderr)
                bad += 1
                continue
        world = None
        try:
            world = mf.read_manifest(mf.rank_dir(args.dir, step, ranks[0])).world_size if ranks else None
        except mf.CheckpointInvalid:
            pass
        if world is not None and ranks != list(range(world)):
            print(f"BAD step {step}: ranks present {ranks}, the manifests say {world}", file=sys.stderr)
            bad += 1
        elif world is not None:
            print(f"ok  step {step}: {len(ranks)} rank(s), every checksum matches")
    return 1 if bad else 0
