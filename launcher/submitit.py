"""submitit from Python with the guarantees of ``sres run``/``sres srun``: ``ResilientExecutor``.

A contract (code outside the project imports these names)::

    from launcher.submitit import ResilientExecutor
    ex = ResilientExecutor(folder="logs/%j")            # Slurm where a cluster is configured, else here
    ex.update_parameters(nodes=4, spares=1, timeout_min=60, slurm_partition="gpu", max_restarts=3)
    job = ex.submit(train, *args)                       # train(ctx, *args), as under sres run;
                                                        # any other callable runs as itself
    print(job.result())                                 # what rank 0's train returned
    print(job.events())                                 # the run's events.jsonl, as dicts
    print(job.faults())                                 # its fault events: what recovery fixed

It is submitit's own machinery (pickles, folders, ``job.result()``, ``job.cancel()``), with one
process per job that runs the sres supervisor (``launcher.submitit_job``). The parameters make a
``RunRequest`` (validated when they are set), which that process is given as JSON on its
command line and runs with ``supervise``: on Slurm over the allocation (nodes + spares, ranks as
srun steps, as ``sres srun``), locally on simulated nodes (as ``sres run``). Every rank runs the
submitted function under ``resilience.run``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Any

from submitit.core import core, utils
from submitit.local.local import LocalExecutor, LocalJob, start_controller
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.timeline import Timeline
from launcher.run import environment
from launcher.run.request import RunOptions, RunRequest
from launcher.slurm import discovery
from launcher.submitit_job import command_line, run_dir
from resilience import submitted_call
from resilience.contract.run_dir import RunDir

CLUSTERS = ("slurm", "local")
SHAPE = ("nodes", "spares", "tasks_per_node", "max_restarts")
"""The run's shape, ours to interpret (submitit would give them to sbatch)."""
SHARED = ("timeout_min", "name", "stderr_to_stdout")
"""submitit's generic parameters that both backends take."""
GENERIC = ("mem_gb", "cpus_per_task", "gpus_per_node")
"""AutoExecutor's other generic names: sbatch's after submitit's conversion, kept but unused locally."""
LOCAL = ("setup", "visible_gpus", "signal_delay_s")
"""LocalExecutor's own names (``local_`` prefixed, as AutoExecutor spells them, taken too)."""
SRES_OPTIONS = frozenset(f.name for f in fields(RunOptions)) - {"log_dir"}
"""Parameters that are sres options (``RunOptions``' fields): every option ``sres run`` and
``sres srun`` share, but the log dir, which is the job's (``<folder>/<job id>_sres``)."""
SIGNAL_DELAY_S = 120
"""Seconds before the time limit that Slurm signals the batch host (``--signal=B:USR2@120``):
time for the supervisor to persist the newest commit and requeue."""
LOCAL_TIMEOUT_MIN = 60.0
"""The local controller's time limit when none is given (submitit's own default is 2 min)."""


class _Events:
    """``job.events()``: the run's events.jsonl (empty before the supervisor starts)."""

    # Second base, no slots of its own: submitit's batch() turns a DelayedJob into our job class
    # in place (__class__ assignment), which needs the same layout as submitit's Job.
    __slots__ = ()
    paths: utils.JobPaths
    job_id: str

    def events(self) -> list[dict]:
        """Each a dict (whose undeclared fields raise: :class:`launcher.observability.timeline.Event`)."""
        path = RunDir(run_dir(self.paths.folder, self.job_id)).events
        return list(read_events(path)) if path.exists() else []

    def faults(self) -> list[dict]:
        """The faults the run met so far, as ``fault`` events: a job that succeeded recovered from
        each (its result is what a run without them gives), so a one-off error is not hidden."""
        return list(Timeline(self.events()).of("fault"))


def _rank_0_result(job: core.Job) -> Any:
    """``job.result()``: rank 0's return value. submitit refuses ``result()`` on a job of several
    tasks (use ``results()``); ours are the ranks, and rank 0's value has always been the job's
    result: the one submitit behaviour changed on purpose (docs/guide/submitit.md)."""
    return job.results()[0] if job._sub_jobs else core.Job.result(job)


class ResilientLocalJob(LocalJob, _Events):
    result = _rank_0_result


class SlurmStateWatcher(SlurmInfoWatcher):
    """Job states from slurmctld through our Slurm client (``scontrol show job``), so that
    ``job.state``/``job.done()`` work on clusters without accounting, where submitit's sacct
    call fails and every job stays UNKNOWN forever. A job slurmctld has forgotten (older
    than MinJobAge) is asked of sacct, and is ``GONE`` (finished) when that fails too."""

    def update(self) -> None:
        from launcher.errors import SlurmError
        from launcher.slurm.client import SlurmClient

        pending = self._registered - self._finished
        if not pending:
            return
        self._num_calls += 1
        client = SlurmClient.create("auto", timeout_s=30.0)
        forgotten = []
        for job_id in pending:
            try:
                self._info_dict[job_id] = {"JobID": job_id, "State": client.job(job_id).state}
            except SlurmError:
                forgotten.append(job_id)
        if forgotten:
            self._info_dict.update({j: {"JobID": j, "State": "GONE"} for j in forgotten})
            super().update()  # sacct, where accounting exists, knows the real end state
        self._last_status_check = core._time.time()
        self._finished |= {j for j in pending if self.is_done(j, mode="cache")}


class ResilientSlurmJob(SlurmJob, _Events):
    watcher = SlurmStateWatcher(delay_s=60)
    result = _rank_0_result


class _SresCommand:
    """What both backends run per job: the supervisor, given the run's request. The job's tasks
    are the run's ranks (``job.task(k)``, ``results()``, per-task logs), not its processes."""

    folder: Path
    python: str
    request: RunRequest

    def _num_tasks(self) -> int:
        return self.request.nodes * self.request.procs_per_node

    @property
    def _submitit_command_str(self) -> str:
        argv = command_line(self.python, self.folder, self.request)
        return " ".join(shlex.quote(a) if a != self.python else a for a in argv)


class _LocalBackend(_SresCommand, LocalExecutor):
    """submitit's local controller with one task: the supervisor and its simulated nodes."""

    job_class = ResilientLocalJob

    def _submit_command(self, command: str) -> ResilientLocalJob:
        # LocalExecutor's own builds a plain LocalJob and one task per rank; ranks are sres's here.
        process = start_controller(
            folder=self.folder,
            command=command,
            tasks_per_node=1,
            cuda_devices="",
            timeout_min=self.parameters.get("timeout_min", LOCAL_TIMEOUT_MIN),
            signal_delay_s=self.parameters.get("signal_delay_s", 30),
            stderr_to_stdout=self.parameters.get("stderr_to_stdout", False),
            setup=self.parameters.get("setup", ()),
        )
        # The controller opens its logs in the job's folder as soon as it starts, and makes only
        # the folder's template (submitit creates <folder>/<job id> when it moves the pickle, a
        # little later): on a loaded machine it lost that race (ci3), so the folder is made now.
        utils.JobPaths(self.folder, job_id=str(process.pid)).folder.mkdir(parents=True, exist_ok=True)
        tasks = list(range(self._num_tasks()))
        return ResilientLocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=tasks)


class _SlurmBackend(_SresCommand, SlurmExecutor):
    """submitit's Slurm executor whose batch script runs the supervisor once, on the batch host."""

    job_class = ResilientSlurmJob

    @property
    def _submitit_command_str(self) -> str:
        # exec: the preemption signal (B:USR2) then reaches the supervisor, not a bash that dies of it.
        return "exec " + super()._submitit_command_str

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job]:
        jobs = super()._internal_process_submissions(delayed_submissions)
        # For an array submitit builds plain SlurmJobs (its array path names the class): ours
        # read states without sacct and have events().
        return [
            job
            if isinstance(job, ResilientSlurmJob)
            else ResilientSlurmJob(self.folder, job.job_id, tasks=list(range(self._num_tasks())))
            for job in jobs
        ]


def _unprefixed(kwargs: dict[str, Any], cluster: str) -> dict[str, Any]:
    """AutoExecutor's spellings: ``local_setup`` is ``setup`` locally; ``slurm_mem_gb`` (a generic
    name prefixed) is ``mem_gb`` on Slurm. The other cluster's prefixed names are ignored, as
    AutoExecutor ignores them; ``slurm_*`` sbatch names stay for the Slurm backend."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        prefix, _, rest = key.partition("_")
        if prefix == "local" and rest in (*SHARED, *GENERIC, *LOCAL):
            if cluster == "local":
                out[rest] = value
        elif prefix == "slurm" and rest in (*SHARED, *GENERIC):
            out[rest if cluster == "slurm" else key] = value
        else:
            out[key] = value
    return out


def slurm_available() -> bool:
    """Slurm for ``cluster=None``: sbatch here and a cluster configured for it."""
    return discovery.cluster_configured()


class ResilientExecutor(core.Executor):
    """submitit executor whose jobs recover in-process from faults, with peers' state.

    ``cluster``: ``"slurm"``, ``"local"``, or None for Slurm when ``sbatch`` is on PATH and a
    cluster is configured for it (``SLURM_CONF``, ``/etc/slurm/slurm.conf``, configless mode's
    cache, or inside an allocation), else local. Parameters: the run's shape (``nodes``,
    ``spares``, ``tasks_per_node``, ``max_restarts``), every option of ``sres run``/``sres srun``
    by its long name (``inject``, ``hang_timeout``, ``persistent_dir``, ``min_nodes``, ...: the
    fields of ``RunOptions``), AutoExecutor's generic names (``timeout_min``, ``name``,
    ``mem_gb``, ``cpus_per_task``, ``gpus_per_node``, ``stderr_to_stdout``, converted as submitit
    converts them), LocalExecutor's (``setup``, ``visible_gpus``, ``signal_delay_s``; also
    ``local_``-prefixed), and ``slurm_*`` parameters for sbatch (ignored locally). An unknown name
    or a bad value raises ValueError at once; ``executor.parameters`` holds what was set. Options
    not given come from this process's ``SRES_*`` variables, read when parameters are set.
    """

    def __init__(
        self,
        folder: str | Path,
        cluster: str | None = None,
        max_num_timeout: int = 3,
        python: str | None = None,
        max_pickle_size_gb: float = 1.0,
    ) -> None:
        super().__init__(folder)
        cluster = cluster or ("slurm" if slurm_available() else "local")
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster={cluster!r}: one of {', '.join(CLUSTERS)} (or None to choose)")
        self.cluster = cluster
        self.max_num_timeout = max_num_timeout
        backend = _SlurmBackend if cluster == "slurm" else _LocalBackend
        self._executor = backend(
            folder, max_num_timeout=max_num_timeout, python=python, max_pickle_size_gb=max_pickle_size_gb
        )
        self._shape: dict[str, int] = {"nodes": 1, "spares": 0, "tasks_per_node": 1, "max_restarts": 3}
        self._sres: dict[str, Any] = {}
        self._sbatch_extra: dict[str, Any] = {}
        self._signal_delay_s = SIGNAL_DELAY_S
        self._apply()

    @property
    def job_class(self) -> type[core.Job]:  # type: ignore[override]
        return self._executor.job_class

    @property
    def max_pickle_size_gb(self) -> float:
        """submitit's bound on a submission's pickles (its backends check it at submit)."""
        return self._executor.max_pickle_size_gb

    @max_pickle_size_gb.setter
    def max_pickle_size_gb(self, value: float) -> None:
        self._executor.max_pickle_size_gb = value

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        given = dict(kwargs)
        kwargs = _unprefixed(kwargs, self.cluster)
        shape = {k: kwargs.pop(k) for k in SHAPE if k in kwargs}
        for key, value in shape.items():
            if not isinstance(value, int) or value < (1 if key in ("nodes", "tasks_per_node") else 0):
                raise ValueError(f"{key}={value!r}: a whole number, at least {1 if key != 'spares' else 0}")
        backend = {k: kwargs.pop(k) for k in (*SHARED, *GENERIC) if k in kwargs}
        local = {k: kwargs.pop(k) for k in LOCAL if k in kwargs}
        slurm = {k.removeprefix("slurm_"): kwargs.pop(k) for k in list(kwargs) if k.startswith("slurm_")}
        sres = {**self._sres, **kwargs}
        unknown = next((key for key in sres if key not in SRES_OPTIONS), None)
        if unknown is not None:
            raise ValueError(f"unknown parameter {unknown!r}: not a submitit or sres option")
        self._request({**self._shape, **shape}, sres)  # refuses a bad value before anything changes
        signal_delay_s = slurm.pop("signal_delay_s", local.pop("signal_delay_s", self._signal_delay_s))
        if not isinstance(signal_delay_s, int) or signal_delay_s < 0:
            raise ValueError(f"signal_delay_s={signal_delay_s!r}: a whole number of seconds, at least 0")
        self._sbatch_extra.update(slurm.pop("additional_parameters", {}))
        if self.cluster == "slurm":
            if "timeout_min" in backend:
                backend["timeout_min"] = int(backend["timeout_min"])
            slurm.update(self._executor._convert_parameters(backend))  # submitit's: mem_gb=4 -> mem="4GB"
            self._executor.update_parameters(**slurm)
        else:
            self._executor.update_parameters(**backend, **local, signal_delay_s=signal_delay_s)
        self._signal_delay_s = signal_delay_s
        self._shape.update(shape)
        self._sres = sres
        self.parameters.update(given)
        self._apply()

    def _request(self, shape: dict[str, int], sres: dict[str, Any]) -> RunRequest:
        """The job's request, but its command and log dir (the job's own). Options not given
        come from this process's ``SRES_*`` variables (as for ``sres run``), else their defaults.
        Requeues are sres's (persist the newest commit, run rank 0's checkpoint, then scontrol
        requeue on Slurm, submitit's local controller's rerun locally). As under submitit, those
        at the time limit are capped by max_num_timeout and preemptions are not (Slurm's
        MaxBatchRequeue still is, and the local controller's 6 runs); max_requeues caps these too
        when given."""
        values: dict[str, Any] = environment.values(os.environ)
        values.update(max_timeout_requeues=self.max_num_timeout, max_requeues=None)
        values.update(sres)
        values.pop("log_dir", None)
        try:
            return RunRequest(
                command=(),
                nodes=shape["nodes"],
                procs_per_node=shape["tasks_per_node"],
                spares=shape["spares"],
                max_restarts=shape["max_restarts"],
                placement="srun" if self.cluster == "slurm" else "local",
                options=RunOptions.from_values(values),
            )
        except ConfigError as err:
            raise ValueError(str(err)) from None

    def _apply(self) -> None:
        """Hand the backend the job's request and, on Slurm, the allocation it needs."""
        request = self._request(self._shape, self._sres)
        if self.cluster == "slurm":
            signal = request.options.preempt_signal.upper().removeprefix("SIG")
            sbatch = {
                "no_kill": True,
                "requeue": True,
                "signal": f"B:{signal}@{self._signal_delay_s}",
                # task 0's log is the batch script's and rank 0's: both append, neither overwrites
                "open_mode": "append",
                **self._sbatch_extra,
            }
            self._executor.update_parameters(
                nodes=request.nodes + request.spares,
                ntasks_per_node=request.procs_per_node,
                use_srun=False,
                additional_parameters=sbatch,
            )
        self._executor.request = request

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job]:
        for delayed in delayed_submissions:  # before anything is written or queued
            submitted_call.check(delayed.function, delayed.args, delayed.kwargs)
        return self._executor._internal_process_submissions(delayed_submissions)
