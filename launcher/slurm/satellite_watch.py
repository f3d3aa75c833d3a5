"""The batch step of a satellite job: it lives while the training job runs, and no longer.

When it exits, Slurm ends the satellite and every rank step in it. It asks Slurm, not the
supervisor: the training job may have ended in any way (scancel, time limit, the batch
host's loss, a requeue), and none of them leaves a supervisor to say so.

    python -m launcher.slurm.satellite_watch MAIN_JOB_ID [--period S]
"""

from __future__ import annotations

import argparse
import sys
import time

from launcher.errors import SlurmError
from launcher.slurm.client import default_client

ALIVE = ("RUNNING", "CONFIGURING", "SUSPENDED", "RESIZING")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.slurm.satellite_watch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("main_job")
    parser.add_argument("--period", type=float, default=2.0, help="seconds between looks at the training job")
    args = parser.parse_args(argv)
    client = default_client()
    failures = 0
    while True:
        try:
            state = client.job(args.main_job).state
            failures = 0
        except SlurmError as err:
            # The job has left slurmctld's memory, or the controller is away: a few misses in a row end it.
            failures += 1
            state = "UNKNOWN"
            if failures >= 3:
                print(f"satellite: job {args.main_job} is unknown to Slurm ({err}); ending", flush=True)
                return 0
        if state not in ALIVE and state != "UNKNOWN":
            print(f"satellite: job {args.main_job} is {state}; ending", flush=True)
            return 0
        time.sleep(args.period)


if __name__ == "__main__":
    sys.exit(main())
