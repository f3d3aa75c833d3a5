"""The command-line Slurm driver: ``sinfo --json``, ``scontrol -o``, ``sbatch``, ``salloc``.

It works with any Slurm that has the commands, which is why it is the default. Facts of
Slurm 22.05 that shape it (checked on the test cluster, see ../shared/slurm-testbed.md):
``squeue --json`` ignores ``--jobs`` and returns every job, so one job is read with
``scontrol -o show job`` (but its owner and Comment, never from text a user wrote: from
``squeue --json`` all the same); ``scontrol -o show node`` splits multi-word reasons into tokens, so
nodes are read from ``sinfo --json``; ``scontrol`` has no ``--json`` in 22.05.

:class:`CommandLine` is the one runner of Slurm commands in the project (a timeout on every
call; a failure is a ``SlurmCommandError`` with argv, exit code and stderr; a missing tool
``SlurmUnavailable``). The parsers of Slurm's output are pure functions, tested on output
recorded from the real cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.slurm import hostlist
from launcher.errors import SlurmCommandError, SlurmError, SlurmUnavailable
from launcher.slurm.types import Job, JobOwner, Node, duration_s, split_state

Runner = Callable[..., subprocess.CompletedProcess]
"""``subprocess.run``-compatible: injectable so tests can count or slow down commands."""

DEFAULT_TIMEOUT_S = 30.0

_INSTALL_HINT = {
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "sbatch": "slurm-client",
    "salloc": "slurm-client",
    "scancel": "slurm-client",
    "srun": "slurm-client",
}


@dataclass
class CommandLine:
    """Runs Slurm commands: the one place where this project executes them.

    Every call has a timeout; a failure raises :class:`SlurmCommandError` with the command,
    its exit code and stderr; a missing program raises :class:`SlurmUnavailable`.
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    env: Mapping[str, str] | None = None
    runner: Runner = subprocess.run

    def __call__(self, argv: Sequence[str], timeout_s: float | None = None, cwd: str | None = None) -> str:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        where = {"cwd": cwd} if cwd else {}
        try:
            result = self.runner(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=dict(self.env) if self.env is not None else None,
                stdin=subprocess.DEVNULL,
                **where,
            )
        except FileNotFoundError:
            package = _INSTALL_HINT.get(argv[0], "slurm-client")
            raise SlurmUnavailable(
                f"'{argv[0]}' not found on PATH: install Slurm's client tools (Debian: apt-get install "
                f"{package})"
            ) from None
        except subprocess.TimeoutExpired as err:
            stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
            raise SlurmCommandError(argv, None, f"no answer within {timeout:g} s {stderr}") from None
        if result.returncode != 0:
            raise SlurmCommandError(argv, result.returncode, result.stderr)
        return result.stdout


class CliDriver:
    """Slurm through its command-line tools."""

    name = "cli"

    def __init__(self, command: CommandLine | None = None) -> None:
        self.command = command or CommandLine()

    def version(self) -> str:
        """``"22.05.8"``: the version of the client tools (the controller's is in ``doctor``)."""
        out = self.command(["scontrol", "--version"]).strip()
        return out.split()[-1] if out else ""

    def ping(self) -> str:
        return self.command(["scontrol", "ping"]).strip()

    def nodes(self) -> list[Node]:
        data = _load_json(self.command(["sinfo", "--json"]), "sinfo --json")
        return [_node_from_sinfo(record) for record in data.get("nodes", [])]

    def job(self, job_id: str) -> Job:
        out = self.command(["scontrol", "-o", "show", "job", str(job_id)])
        records = [parse_scontrol_record(line) for line in out.splitlines() if line.strip()]
        if not records:
            raise SlurmError(f"Slurm knows no job {job_id}")
        return job_from_scontrol(pick_record(records, str(job_id)))

    def job_owner(self, job_id: str) -> JobOwner:
        data = _load_json(self.command(["squeue", "--json"]), "squeue --json")
        return job_owner_from_squeue(data, str(job_id))

    def config(self) -> dict[str, str]:
        return parse_show_config(self.command(["scontrol", "show", "config"]))

    def jobs(self) -> list[Job]:
        out = self.command(["scontrol", "-o", "show", "job"])
        return [
            job_from_scontrol(parse_scontrol_record(line))
            for line in out.splitlines()
            if line.strip().startswith("JobId=")
        ]

    def set_node_state(self, nodes: Sequence[str], state: str, reason: str | None = None) -> None:
        argv = ["scontrol", "update", f"NodeName={hostlist.compress(nodes)}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self.command(argv)

    def reboot(self, nodes: Sequence[str], reason: str) -> None:
        self.command(
            ["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", hostlist.compress(nodes)]
        )

    def update_job(self, job_id: str, **fields: str) -> None:
        # A resize makes scontrol write slurm_job_<id>_resize.{sh,csh} into its working
        # directory; nothing here reads them (nodes are asked from Slurm), so they go nowhere.
        with tempfile.TemporaryDirectory(prefix="sres-scontrol-") as scratch:
            self.command(
                ["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())],
                cwd=scratch,
            )

    def requeue(self, job_id: str, hold: bool = False) -> None:
        self.command(["scontrol", "requeuehold" if hold else "requeue", str(job_id)])

    def submit(self, sbatch_args: Sequence[str]) -> str:
        """Run ``sbatch --parsable ARGS``; return the job id (``123`` or ``123;cluster``)."""
        out = self.command(["sbatch", "--parsable", *sbatch_args]).strip()
        return out.split(";", 1)[0]

    def allocate_expansion(
        self, job_id: str, count: int, partition: str | None, exclude: Sequence[str], timeout_s: float
    ) -> str:
        """Allocate ``count`` exclusive nodes as an expansion job of ``job_id``.

        ``salloc --no-shell``, because an expansion job must have no running step (an
        ``sbatch --wrap`` one would); ``--immediate`` so that we fail fast when the partition
        has no idle node instead of queueing behind other work; ``--exclude`` because an
        expansion may otherwise land on a node the job already holds (seen on 22.05 even with
        ``--exclusive``), which adds cores, not a node.
        """
        argv = [
            "salloc",
            "--no-shell",
            f"--nodes={count}",
            "--exclusive",
            f"--dependency=expand:{job_id}",
            f"--immediate={max(1, int(timeout_s))}",
            f"--job-name=sres-expand-{job_id}",
        ]
        if partition:
            argv.append(f"--partition={partition}")
        if exclude:
            argv.append(f"--exclude={hostlist.compress(exclude)}")
        try:
            self.command(argv, timeout_s=timeout_s + 10)
        except SlurmCommandError as err:
            raise SlurmError(
                f"could not allocate {count} more node(s) for job {job_id}: {err.stderr or err}"
            ) from err
        return self._newest_job_named(f"sres-expand-{job_id}")

    def run_step(self, job_id: str, node: str, argv: Sequence[str], timeout_s: float) -> str:
        return self.command(
            [
                "srun",
                f"--jobid={job_id}",
                "--overlap",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={node}",
                "--chdir=/",  # never the caller's directory (or /tmp): see resilience.own_python
                "--quiet",
                *argv,
            ],
            timeout_s=timeout_s,
        )

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(job_id)]
        self.command(argv)

    def _newest_job_named(self, name: str) -> str:
        """Find the job salloc just made: its id is only printed in a message on stderr,
        which we do not parse; the name we gave it is data."""
        out = self.command(["squeue", "-h", "--name", name, "-o", "%i"])
        ids = [line.strip() for line in out.splitlines() if line.strip()]
        if not ids:
            raise SlurmError(f"salloc reported success but no job named {name} is in the queue")
        return max(ids, key=lambda i: int(i.split("_")[0]))


# --- parsing: pure functions, unit-tested on output recorded from the test cluster ---------

_RECORD = re.compile(r"(\S+?)=(.*?)(?=\s+[^\s=]+=|\s*$)")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o show`` record into key/value pairs.

    Values may contain spaces (``Reason=sres: gpu lost``) and ``=`` (``TRES=cpu=2,node=1``):
    a value runs until the next whitespace-separated ``Key=``.
    """
    return {m.group(1): m.group(2).strip() for m in _RECORD.finditer(line.strip())}


def parse_show_config(text: str) -> dict[str, str]:
    """``Key = Value`` lines of ``scontrol show config``; the header and other lines are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def pick_record(records: Sequence[Mapping[str, str]], job_id: str) -> Mapping[str, str]:
    """The record of ``job_id`` among what ``scontrol show job`` printed: an array's id shows
    every task, and a task's own numeric id can be the array's."""
    for record in records:
        task = f"{record.get('ArrayJobId')}_{record.get('ArrayTaskId')}"
        if job_id in (record.get("JobId"), task):
            return record
    return records[0]


def job_from_scontrol(record: Mapping[str, str]) -> Job:
    def text(key: str) -> str:
        value = record.get(key, "")
        return "" if value in ("(null)", "None", "N/A") else value

    node_list = text("NodeList")
    array_job = text("ArrayJobId") or None
    return Job(
        job_id=record.get("JobId", ""),
        state=record.get("JobState", "UNKNOWN").upper(),
        name=text("JobName"),
        nodes=tuple(hostlist.expand(node_list)) if node_list else (),
        num_nodes=_int(record.get("NumNodes", "0").split("-")[0]),
        restart_count=_int(record.get("Restarts", "0")),
        reason=record.get("Reason", ""),
        partition=text("Partition"),
        batch_host=text("BatchHost"),
        array_job_id=array_job,
        array_task_id=text("ArrayTaskId") or None,
        exit_code=record.get("ExitCode", ""),
        time_limit_s=duration_s(record.get("TimeLimit", "")),
        run_time_s=duration_s(record.get("RunTime", "")),
        extra=dict(record),
    )


def job_owner_from_squeue(data: Mapping, job_id: str) -> JobOwner:
    """Job ``job_id`` (or array task ``A_T``) among ``squeue --json``'s jobs, typed fields only.
    Slurm 22.05 spells the Comment as a string and the state as one; later releases as
    ``{"job": ...}`` and a list."""
    for record in data.get("jobs", []):
        task = f"{record.get('array_job_id')}_{record.get('array_task_id')}"
        if job_id not in (str(record.get("job_id")), task):
            continue
        comment, state = record.get("comment") or "", record.get("job_state") or "UNKNOWN"
        if isinstance(comment, dict):
            comment = comment.get("job") or ""
        if isinstance(state, list):
            state = state[0] if state else "UNKNOWN"
        user_id = record.get("user_id")
        if not isinstance(user_id, int) or isinstance(user_id, bool):
            raise SlurmError(f"squeue --json gives job {job_id} no numeric user_id: its owner is unknown")
        end = record.get("end_time")
        end = end.get("number") if isinstance(end, dict) and end.get("set", True) else end
        return JobOwner(
            job_id,
            user_id,
            str(state).upper(),
            str(record.get("batch_host") or ""),
            str(comment),
            float(end) if isinstance(end, (int, float)) and not isinstance(end, bool) and end > 0 else None,
        )
    raise SlurmError(f"Slurm knows no job {job_id}")


def _node_from_sinfo(record: Mapping) -> Node:
    base, flags = split_state(str(record.get("state", "unknown")))
    flags = flags | {str(f).upper() for f in record.get("state_flags", [])}
    return Node(
        name=str(record["name"]),
        state=base,
        flags=frozenset(flags),
        reason=str(record.get("reason") or ""),
        partitions=tuple(record.get("partitions") or ()),
        address=str(record.get("address") or ""),
        hostname=str(record.get("hostname") or ""),
        cpus=_int(record.get("cpus", 0)),
        port=_int(record.get("port", 0)),
    )


def _load_json(text: str, what: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SlurmError(f"'{what}' printed something that is not JSON ({err}); is Slurm >= 21.08?") from None
    errors = data.get("errors") or []
    if errors:
        raise SlurmError(f"'{what}' reported errors: {errors}")
    return data


def _int(value: object) -> int:
    try:
        return int(str(value).split("(")[0])
    except ValueError:
        return 0
