"""The epilog's wall time, this tree against an earlier commit, interleaved.

Slurm runs the epilog on every node at the end of every job, and the node takes no new job
until it is done. Each trial runs the real entry, as a node does: the wrapper script that
``sres hooks install`` writes (``hooks/epilog``: pins the config, then ``exec sres hooks
epilog``, ``sres`` being ``launcher.entry``), in the environment slurmd gives an epilog
(``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURMD_NODENAME``, ``SLURM_SCRIPT_CONTEXT``..., no
``PATH``), against a RAM tier of its own: a temporary directory (``ram_root`` in the hook
config; under ``--ram-parent``, default /dev/shm) holding a job's checkpoints, 2 nodes x 3
steps x 4 ranks x ``--mib``, ``own`` and ``neighbour``, re-made before each trial.
The epilog removes every step but the newest of each part (nothing is persisted; the newest two
since it keeps ``keep_ram`` steps per rank); each trial checks that it did. No Slurm is needed:
the checks that would ask a cluster or read NVML (slurmctld, processes, gpu) are off on both
sides, so the time is the entry's own plus the cleanup, the memory/disk/shm checks and the JSON
log.

Both sides run from their own tree (a git worktree of ``--base``), alternating which goes
first. An untimed run of each first (it also warms the page cache) says whether that side
imports torch, from ``PYTHONPROFILEIMPORTTIME``.

    python benchmarks/epilog.py [--base e693ee9] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trees import worktree  # noqa: E402
from resilience.tiers.checkpoint_dirs import FileEntry, Manifest, rank_dir  # noqa: E402
from slurm_plugins.wrappers import wrapper_text  # noqa: E402

BASE = "e693ee9"
"""main before the epilog stopped importing torch (issue 28)."""
JOB = "990001"
NODES = ("bench-n1", "bench-n2")
PARTS = ("own", "neighbour")
STEPS, RANKS = 3, 4
TORCH_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \|\s+torch$", re.MULTILINE)


def slurm_epilog_env(job: str, node: str, conf: Path) -> dict[str, str]:
    """What slurmd (22.05) gives an epilog: the job, the node, the cluster; no PATH."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_JOB_USER": os.environ.get("USER", "root"),
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_PARTITION": "bench",
        "SLURM_NODELIST": ",".join(NODES),
        "SLURMD_NODENAME": node,
        "SLURM_CLUSTER_NAME": "bench",
        "SLURM_CONF": str(conf),
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
    }


class Side:
    """One tree's installed hook: its wrapper, config, log and RAM tier, under ``work``."""

    def __init__(self, name: str, tree: Path, work: Path, ram_parent: Path, mib: int) -> None:
        self.name, self.tree, self.work, self.mib = name, tree, work, mib
        self.ram = Path(tempfile.mkdtemp(prefix=f"sres-bench-epilog-{name}-", dir=ram_parent))
        self.log = work / "health.jsonl"
        prefix = work / "etc"
        (prefix / "hooks").mkdir(parents=True)
        config = {
            "ram_root": str(self.ram),
            "state_dir": str(work / "state"),
            "log": {"file": str(self.log), "syslog": False},
            "checks": {n: {"enabled": False} for n in ("gpu", "processes", "slurmctld")},
        }
        (prefix / "health.yaml").write_text(yaml.safe_dump(config))
        self.wrapper = prefix / "hooks" / "epilog"
        sres = f"{sys.executable} -m launcher.entry"  # what the `sres` console script runs
        self.wrapper.write_text(wrapper_text("epilog", str(prefix), sres, {"PYTHONPATH": str(tree)}))
        self.wrapper.chmod(0o755)
        self.env = slurm_epilog_env(JOB, NODES[0], work / "slurm.conf")  # no such file: no cluster

    def run(self, extra: dict[str, str] | None = None) -> tuple[float, str]:
        """One epilog; its wall seconds and stderr. Raises when it failed or cleaned wrongly."""
        newest = make_ram_tier(self.ram, self.mib)
        start = time.perf_counter()
        done = subprocess.run(
            [str(self.wrapper)],
            env={**self.env, **(extra or {})},
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: the epilog exited {done.returncode}:\n{done.stderr[-2000:]}")
        left = sorted(p.relative_to(self.ram).as_posix() for p in self.ram.glob("job-*/node-*/*/step-*"))
        # Before 2026-11-25 the newest step of each part stayed; since, the newest keep_ram (2).
        wanted = [
            sorted(f"job-{JOB}/node-{n}/{part}/step-{s:08d}" for n in NODES for part in PARTS for s in steps)
            for steps in ([newest], [newest - 10, newest])
        ]
        if left not in wanted:
            raise SystemExit(f"{self.name}: the epilog left {left}, expected one of {wanted}")
        return took, done.stderr


def make_ram_tier(ram: Path, mib: int) -> int:
    """A job's RAM tier as ranks leave it: STEPS complete steps of RANKS ranks in each part of
    each node, ``mib`` MiB of state per rank. Returns the newest step."""
    shutil.rmtree(ram / f"job-{JOB}", ignore_errors=True)
    payload = os.urandom(1 << 20) * mib
    for node in NODES:
        for part in PARTS:
            for step in range(10, 10 * (STEPS + 1), 10):
                for rank in range(RANKS):
                    path = rank_dir(ram / f"job-{JOB}" / f"node-{node}" / part, step, rank)
                    path.mkdir(parents=True)
                    (path / "replicated.bin").write_bytes(payload)
                    entry = FileEntry(len(payload), "0" * 16)
                    manifest = Manifest(
                        JOB, step, RANKS, rank, {"replicated.bin": entry}, created=time.time()
                    )
                    (path / "manifest.json").write_text(manifest.to_json())
    return 10 * STEPS


def torch_import_s(stderr: str) -> float | None:
    """Cumulative seconds of ``import torch`` in a PYTHONPROFILEIMPORTTIME run, None without."""
    found = TORCH_LINE.search(stderr)
    return int(found.group(1)) / 1e6 if found else None


def _row(name: str, times: list[float], torch_s: float | None) -> str:
    torch = f"yes ({torch_s:.2f} s)" if torch_s is not None else "no"
    return f"  {name:24s} {statistics.median(times):9.3f} {min(times):9.3f} {max(times):9.3f}   {torch}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=BASE, help=f"the earlier commit (default {BASE})")
    parser.add_argument("--repeat", type=int, default=20, help="timed epilogs per side (default 20)")
    parser.add_argument("--mib", type=int, default=1, help="MiB of state per rank and step (default 1)")
    parser.add_argument("--ram-parent", type=Path, default=Path("/dev/shm"), help="where the RAM tier goes")
    args = parser.parse_args()
    ram_parent = args.ram_parent if args.ram_parent.is_dir() else Path(tempfile.gettempdir())
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="sres-bench-epilog-") as tmp:
        work = Path(tmp)
        with worktree(args.base, work / "base") as base:
            sides: dict[str, Side] = {}
            try:
                for name, tree in (("before", base), ("after", ROOT)):
                    sides[name] = Side(name, tree, work / name, ram_parent, args.mib)
                torch_s = {
                    n: torch_import_s(s.run({"PYTHONPROFILEIMPORTTIME": "1"})[1]) for n, s in sides.items()
                }
                for trial in range(args.repeat):
                    order = ("before", "after") if trial % 2 == 0 else ("after", "before")
                    for name in order:
                        times[name].append(sides[name].run()[0])
                    before, after = times["before"][-1], times["after"][-1]
                    print(f"  trial {trial + 1}: before {before:.3f} s, after {after:.3f} s", flush=True)
            finally:
                for side in sides.values():
                    shutil.rmtree(side.ram, ignore_errors=True)
    print(f"\nepilog wall time, {args.repeat} interleaved runs per side (seconds)")
    print(f"  {'':24s} {'median':>9s} {'min':>9s} {'max':>9s}   imports torch")
    print(_row(f"before ({args.base})", times["before"], torch_s["before"]))
    print(_row("after (this tree)", times["after"], torch_s["after"]))
    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    print(f"  after/before: {ratio:.2f}x median, {min(times['after']) / min(times['before']):.2f}x min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
