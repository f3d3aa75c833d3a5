"""The pyslurm Slurm driver: queries and node updates through Slurm's C API.

Used only when pyslurm imports and was built for the cluster's Slurm major.minor (pyslurm
X.Y.z targets Slurm X.Y). It saves a process start per query, which matters when a
supervisor polls node states every second on a large cluster.

pyslurm 22.5's dictionary API (``pyslurm.node``, ``pyslurm.job``, ``slurm_requeue``) has no
job-update call, and none of its versions wraps ``salloc``'s expansion dependency; those
operations (shrink, grow, submit, cancel) go through the command-line driver, which is the
reason this class wraps one instead of standing alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import ModuleType

from launcher.slurm import hostlist
from launcher.errors import SlurmError
from launcher.slurm.command_driver import CliDriver
from launcher.slurm.types import Job, JobOwner, Node, split_state


def pyslurm_version(module: ModuleType) -> tuple[int, int] | None:
    """(major, minor) of the Slurm API pyslurm was built against, e.g. (22, 5)."""
    api = getattr(module, "slurm_api_version", None)
    if callable(api):
        try:
            major, minor, *_ = api()
            return int(major), int(minor)
        except Exception:  # noqa: BLE001 - a broken build is "no match", reported by doctor
            pass
    text = getattr(module, "__version__", "") or ""
    match = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def slurm_major_minor(version: str) -> tuple[int, int] | None:
    """``"22.05.8"`` -> (22, 5)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


class PyslurmDriver:
    """Slurm through pyslurm (22.5-style dictionary API), command line for the rest."""

    name = "pyslurm"

    def __init__(self, module: ModuleType, cli: CliDriver) -> None:
        self.pyslurm = module
        self.cli = cli

    def version(self) -> str:
        return self.cli.version()

    def ping(self) -> str:
        return self.cli.ping()

    def nodes(self) -> list[Node]:
        try:
            records = self.pyslurm.node().get()
        except ValueError as err:
            raise SlurmError(f"pyslurm could not list nodes: {err.args[0] if err.args else err}") from None
        return [_node_from_pyslurm(name, record) for name, record in records.items()]

    def _job_record(self, job_id: str) -> dict:
        try:
            records = self.pyslurm.job().find_id(str(job_id))
        except ValueError as err:
            raise SlurmError(f"Slurm knows no job {job_id} ({err.args[0] if err.args else err})") from None
        if not records:
            raise SlurmError(f"Slurm knows no job {job_id}")
        return dict(records[0])

    def job(self, job_id: str) -> Job:
        return _job_from_pyslurm(self._job_record(job_id))

    def job_owner(self, job_id: str) -> JobOwner:
        """From pyslurm's typed job record; a record without a numeric ``user_id`` is refused
        (fails closed: the owner is never guessed)."""
        record = self._job_record(job_id)
        user_id = record.get("user_id")
        if not isinstance(user_id, int) or isinstance(user_id, bool):
            raise SlurmError(f"pyslurm gives job {job_id} no numeric user_id: its owner is unknown")
        return JobOwner(
            str(record.get("job_id")),
            user_id,
            str(record.get("job_state") or "UNKNOWN").upper(),
            str(record.get("batch_host") or ""),
            str(record.get("comment") or ""),
            _end_time(record.get("end_time")),
        )

    def set_node_state(self, nodes: Sequence[str], state: str, reason: str | None = None) -> None:
        constant = {"DRAIN": "NODE_STATE_DRAIN", "RESUME": "NODE_RESUME"}.get(state.upper())
        if constant is None:
            return self.cli.set_node_state(nodes, state, reason)
        update: dict[str, object] = {
            "node_names": hostlist.compress(nodes),
            "node_state": getattr(self.pyslurm, constant),
        }
        if reason is not None:
            update["reason"] = reason
        try:
            self.pyslurm.node().update(update)
        except ValueError as err:
            raise SlurmError(f"pyslurm could not set {state} on {update['node_names']}: {err}") from None

    def reboot(self, nodes: Sequence[str], reason: str) -> None:
        # pyslurm 22.5 does not wrap slurm_reboot_nodes with a reason and next state.
        self.cli.reboot(nodes, reason)

    def requeue(self, job_id: str, hold: bool = False) -> None:
        # slurm_requeue takes the numeric id of one job; an array task id ("123_4") resolves
        # to its own job id first.
        numeric = int(self.job(job_id).job_id)
        state = getattr(self.pyslurm, "JOB_REQUEUE_HOLD", 0) if hold else 0
        try:
            self.pyslurm.slurm_requeue(numeric, state)
        except ValueError as err:
            raise SlurmError(f"pyslurm could not requeue job {job_id}: {err}") from None

    def update_job(self, job_id: str, **fields: str) -> None:
        self.cli.update_job(job_id, **fields)

    def submit(self, sbatch_args: Sequence[str]) -> str:
        return self.cli.submit(sbatch_args)

    def allocate_expansion(
        self, job_id: str, count: int, partition: str | None, exclude: Sequence[str], timeout_s: float
    ) -> str:
        return self.cli.allocate_expansion(job_id, count, partition, exclude, timeout_s)

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        self.cli.cancel(job_id, signal)

    def jobs(self) -> list[Job]:
        return self.cli.jobs()

    def config(self) -> dict[str, str]:
        return self.cli.config()

    def run_step(self, job_id: str, node: str, argv: Sequence[str], timeout_s: float) -> str:
        return self.cli.run_step(job_id, node, argv, timeout_s)


def _node_from_pyslurm(name: str, record: dict) -> Node:
    base, flags = split_state(str(record.get("state") or "UNKNOWN"))
    return Node(
        name=str(record.get("name") or name),
        state=base,
        flags=flags,
        reason=str(record.get("reason") or ""),
        partitions=tuple(record.get("partitions") or ()),
        address=str(record.get("node_addr") or ""),
        hostname=str(record.get("node_hostname") or ""),
        cpus=int(record.get("cpus") or 0),
        port=int(record.get("port") or 0),
    )


def _job_from_pyslurm(record: dict) -> Job:
    nodes = record.get("nodes") or ""
    array_job = record.get("array_job_id")
    array_task = record.get("array_task_id")
    return Job(
        job_id=str(record.get("job_id")),
        state=str(record.get("job_state") or "UNKNOWN").upper(),
        name=str(record.get("name") or ""),
        nodes=tuple(hostlist.expand(nodes)) if nodes else (),
        num_nodes=int(record.get("num_nodes") or 0),
        restart_count=int(record.get("restart_cnt") or 0),
        reason=str(record.get("state_reason") or ""),
        partition=str(record.get("partition") or ""),
        batch_host=str(record.get("batch_host") or ""),
        array_job_id=str(array_job) if array_job else None,
        array_task_id=str(array_task) if array_task is not None else None,
        exit_code=str(record.get("exit_code") or ""),
        time_limit_s=_seconds(record.get("time_limit"), 60),  # pyslurm: minutes, or "UNLIMITED"
        run_time_s=_seconds(record.get("run_time"), 1),
    )


def _seconds(value: object, unit: int) -> float | None:
    return float(value) * unit if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _end_time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)
