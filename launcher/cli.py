"""``sres``: the one command-line entry point (Slurm RESilience).

Errors a user can cause (:class:`SresError`) print one line and exit 1; usage errors exit 2
(argparse). Anything else is our bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from launcher import doctor
from launcher.errors import SresError
from launcher.slurm import SlurmClient


def _cmd_doctor(args: argparse.Namespace) -> int:
    needed = args.slurm or bool(os.environ.get("SLURM_JOB_ID"))
    findings = doctor.run_checks(
        os.environ, needed, lambda: SlurmClient.create(args.backend, timeout_s=args.timeout)
    )
    print(doctor.render(findings))
    failed = [f for f in findings if f.status is doctor.Status.FAIL]
    if failed:
        print(f"\n{len(failed)} problem(s): {', '.join(f.name for f in failed)}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sres", description="Fault-tolerant PyTorch training on Slurm (slurm-resilience)."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done, to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("doctor", help="check this machine: Slurm, backend, torch, /dev/shm, SPANK plugin",
                       description="Report what this machine has for resilient training and how to fix what is missing. "
                                   "Exits 1 when something needed is missing.")
    p.add_argument("--slurm", action="store_true",
                   help="treat Slurm as needed (it is by default only inside an allocation)")
    p.add_argument("--backend", choices=["auto", "cli", "pyslurm"], default="auto",
                   help="Slurm client backend (default: pyslurm if it matches the cluster, else cli)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per Slurm command (default 10)")
    p.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="sres: %(message)s")
    try:
        return int(args.func(args))
    except SresError as err:
        print(f"sres: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
