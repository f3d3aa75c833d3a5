"""``supervise(request)``: run a ``RunRequest`` to its end under the sres supervisor.

What ``sres run``, ``sres srun`` and ``ResilientExecutor``'s job process all call. It returns
the exit code, not the supervisor's ``Outcome``: every caller wants the same mapping (0 when
the run finished, and when it requeued itself, since Slurm then runs the job again from its
saved state; 1 when it failed), and what a failure was is in the run's events.jsonl.

On stderr it says what a user should see: a seeded fault schedule (also kept as
``fault-schedule.json`` in the log dir, so a failing seed replays exactly), where the run is
and its log dir, and how to read its report. Ranks run on simulated nodes of this machine, or
as srun steps of the Slurm job this process runs in (the run then recorded in the job's
Comment, for ``sres grow ... --job J``). A user's error raises ``SresError`` before anything starts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.run import configs, rank_threads
from launcher.run.request import RunRequest
from launcher.slurm.client import SlurmClient
from launcher.supervisor import Outcome, RunConfig, Supervisor
from resilience.contract.run_dir import RunDir
from resilience.open_files import raise_open_files_limit

if TYPE_CHECKING:
    from launcher.placement import Placement
    from launcher.placement.local import LocalRerun
    from launcher.placement.srun import JobHosts, SrunPlacement
    from resilience.contract.injections import Injection
    from resilience.contract.liveness import LivenessServer


def supervise(
    request: RunRequest,
    environ: Mapping[str, str] | None = None,
    job_hosts: JobHosts | None = None,
    rerun: LocalRerun | None = None,
) -> int:
    """Run ``request``; the exit code. ``environ``: where the Slurm job's facts are read
    (default this process's). ``job_hosts``: the Slurm job's nodes when the caller has already
    asked (``sres srun`` counts them for its default shape); asked here otherwise. ``rerun``: a
    local run's requeue (its exit code) and time limit, when its parent runs it again."""
    environ = os.environ if environ is None else environ
    raise_open_files_limit()  # the ranks it starts inherit it
    log_dir = configs.private_log_dir(configs.log_dir_for(request, environ, time.time()))
    restart_count = rerun.restart_count if rerun is not None else None
    config = configs.run_config(request, log_dir, _injections(request, log_dir), environ, restart_count)
    placement, liveness, where = _placement(request, config, environ, job_hosts, rerun)
    _links_can_break(config.injections, placement)
    print(
        f"sres: {config.nodes} node(s) x {config.procs_per_node} rank(s), {config.spares} spare node(s) "
        f"on {where}; log dir {config.log_dir}",
        file=sys.stderr,
    )
    if config.rank_threads is not None:
        note = rank_threads.note(config.rank_threads, configs.ranks_per_machine(request))
        print(f"sres: {note}", file=sys.stderr)
    outcome = Supervisor(config, placement, liveness).run()
    print(f"sres: the run's report: sres report {config.log_dir}", file=sys.stderr)
    return rerun.exit_code if rerun is not None and outcome.requeued else exit_code(outcome)


def _links_can_break(injected: tuple[Injection, ...], placement: Placement) -> None:
    """A network fault needs nodes whose links can be broken: refused in one line before the start."""
    from launcher.errors import ConfigError
    from launcher.placement import NodeLinks
    from resilience.contract.injections import FAULT_KINDS

    asked = [i.spec for i in injected if FAULT_KINDS[i.kind].effect == "break-link"]
    if asked and not isinstance(placement, NodeLinks):
        raise ConfigError(
            f"--inject {asked[0]}: network faults need nodes with networks of their own "
            f"(SRES_NETNS: see docs/explanation/fencing.md); this run's nodes share one"
        )


def exit_code(outcome: Outcome) -> int:
    """0: finished, or requeued (Slurm ends this batch script now and runs the job again from its
    saved state); 1: failed."""
    return 0 if outcome.requeued or outcome.ok else 1


def _injections(request: RunRequest, log_dir: Path) -> tuple[Injection, ...]:
    """The faults to inject; a seeded schedule printed and kept, so that a failing seed replays."""
    injected, schedules = configs.injections(request)
    if schedules:
        for line in schedules:
            print(f"sres: {line}", file=sys.stderr, flush=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        record = {"specs": list(request.options.inject), "injections": [i.spec for i in injected]}
        RunDir(log_dir).fault_schedule.write_text(json.dumps(record, indent=1) + "\n")
    return injected


def _placement(
    request: RunRequest,
    config: RunConfig,
    environ: Mapping[str, str],
    job_hosts: JobHosts | None,
    rerun: LocalRerun | None,
) -> tuple[Placement, LivenessServer | None, str]:
    """Where ranks run (the placement, its liveness server if any) and that place in words."""
    if request.placement == "srun":
        placement, liveness = _srun_placement(request, config.log_dir, environ, job_hosts)
        hosts = ", ".join(placement.hosts[: request.nodes + request.spares])
        return placement, liveness, f"job {placement.job_id} ({hosts})"
    from launcher.placement import links, namespaced
    from launcher.placement.local import LocalPlacement

    kept = dict(repair_after_s=request.options.repair_after, rerun=rerun)
    if environ.get(links.VARIABLE):  # a test's nodes, each with a network of its own
        layout = links.NetnsLayout.parse(environ[links.VARIABLE])
        return namespaced.NamespacedPlacement(layout, config.log_dir, **kept), None, "network namespaces"
    return LocalPlacement(config.log_dir, **kept), None, "this machine"


def _srun_placement(
    request: RunRequest, log_dir: Path, environ: Mapping[str, str], job_hosts: JobHosts | None
) -> tuple[SrunPlacement, LivenessServer]:
    """Ranks as srun steps of this job (and its satellites), and the run recorded in the job's Comment."""
    from launcher.slurm import job_control
    from launcher.placement.srun import SrunPlacement, place
    from resilience.contract import run_secret
    from resilience.contract.liveness import LivenessServer

    o = request.options
    needed = request.nodes + request.spares
    client = SlurmClient.create("auto", timeout_s=30.0)
    if job_hosts is None or (len(job_hosts.hosts) < needed and not o.all_satellites):
        job_hosts = place(client, environ, 1 if o.all_satellites else needed)  # says clearly what is missing
    liveness = LivenessServer(run_secret.kept_in(log_dir), host=job_hosts.store_host)
    placement = SrunPlacement(
        client,
        job_hosts,
        log_dir,
        liveness,
        srun_args=request.step_args,
        partition=request.partition,
        grow=not o.no_grow,
        grow_by=o.grow_by,
        lend_partition=o.lend_partition,
        lend_account=o.lend_account,
        satellite_nodes=needed if o.all_satellites else 0,
    )
    job_control.register(client, placement.job_id, log_dir)
    return placement, liveness
