"""The elastic flags of ``sres run`` (``launcher.run.configs.elastic_config`` reads them) and the
commands that resize a running job: ``sres resize RUN --nodes N``, ``sres grow RUN --by K``,
``sres shrink RUN --by K``, ``sres status RUN``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from launcher.cli.arg_types import finite_float
from launcher.errors import ConfigError
from launcher.supervisor import control
from resilience.contract.elastic_config import ON_NO_SPARE, ElasticConfig
from resilience.contract.elastic_config import BATCH_POLICIES, LR_SCALINGS


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    d = ElasticConfig()
    g = p.add_argument_group(
        "elastic (the world shrinks and grows; off unless --min-nodes or --max-nodes differ from --nodes)"
    )
    g.add_argument("--min-nodes", type=int, help="the world never shrinks below this (default: --nodes)")
    g.add_argument("--max-nodes", type=int, help="the world never grows above this (default: --nodes)")
    g.add_argument(
        "--on-no-spare",
        choices=ON_NO_SPARE,
        help="a node lost with no spare: shrink the world (default when --min-nodes < --nodes), wait for "
        "a node up to --resize-timeout, requeue (Slurm), or fail",
    )
    g.add_argument("--resize-step", type=int, metavar="K", help="the world changes by multiples of K nodes")
    g.add_argument("--resize-sizes", metavar="N,N,...", help="the only node counts allowed, e.g. 2,4,8")
    g.add_argument(
        "--grow-snooze",
        type=finite_float,
        metavar="S",
        help=f"no growth into free capacity within S s of a restart or resize (default {d.grow_snooze_s:g})",
    )
    g.add_argument(
        "--resize-timeout",
        type=finite_float,
        metavar="S",
        help=f"how long 'wait' holds for a node before requeue/failure (default {d.resize_timeout_s:g})",
    )
    g.add_argument(
        "--drain-grace",
        type=finite_float,
        metavar="S",
        help=f"how long ranks may take to reach a step boundary for a resize (default {d.drain_grace_s:g})",
    )
    g.add_argument(
        "--batch-policy",
        choices=BATCH_POLICIES,
        help="a world that does not divide the global batch: use the closest one it divides, or fail "
        "(default keep-closest; resilience.ElasticSampler)",
    )
    g.add_argument(
        "--lr-scaling", choices=LR_SCALINGS, help="LR scale for a changed global batch (default linear)"
    )
    g.add_argument(
        "--elastic-config", type=Path, help="YAML file of these settings (ElasticConfig keys; flags win)"
    )


# --- resizing a running job -------------------------------------------------------------------------


def _reply(args: argparse.Namespace, op: str, **fields) -> int:
    if (args.run is None) == (args.job is None):
        raise ConfigError(f"sres {op}: give the run (its log dir) or --job JOBID, one of them")
    if args.job is not None:
        from launcher.slurm import job_control
        from launcher.slurm.client import default_client

        argv = [op, *(x for k, v in fields.items() for x in (f"--{k}", str(v)))]
        argv += ["--json"] if getattr(args, "json", False) else []
        return job_control.send(
            default_client(), args.job, argv, lambda run, owner: _deliver(run, args, op, fields, owner)
        )
    return _deliver(args.run, args, op, fields)


def _deliver(run: str, args: argparse.Namespace, op: str, fields: dict, owner: int | None = None) -> int:
    answer = control.send(run, op, owner=owner, **fields)
    if not answer.get("ok"):
        raise control.ControlError(answer.get("message", "refused"))
    if op == "status":
        print(_status_text(answer["status"]) if not args.json else json.dumps(answer["status"]))
    else:
        print(f"sres: {answer['message']}")
    return 0


def _status_text(s: dict) -> str:
    lines = [
        f"world size   {s['world_size']} ({len(s['nodes'])} node(s): {', '.join(s['nodes'])})",
        f"spares       {', '.join(s['spares']) or 'none'}",
        f"bounds       {s['min_nodes']} .. {s['max_nodes']} node(s)",
        f"generation   {s['generation']}",
        f"step         {s['step']} (last committed)",
        f"faults       {s['faults']}",
    ]
    r = s.get("last_resize")
    lines.append(
        "last resize  "
        + (
            f"{r['from_world']} -> {r['to_world']} ranks ({r['why']}, generation {r['generation']})"
            if r
            else "none"
        )
    )
    lent = {host: job for host, job in (s.get("jobs") or {}).items() if job != s.get("job_id")}
    if s.get("jobs"):
        held = ", ".join(f"{host} (job {job})" for host, job in lent.items())
        lines.append(
            f"slurm job    {s.get('job_id')}; " + (f"satellites: {held}" if lent else "no satellites")
        )
    if s.get("resizing_to"):
        lines.append(f"resizing to  {s['resizing_to']} node(s)")
    return "\n".join(lines)


def add_parsers(sub) -> None:
    run_help = "the run's log dir (printed by sres run) or its name under sres-runs/; or give --job"
    job_help = "the Slurm job id of a job run by sres srun, instead of RUN (only the job's user or root)"
    p = sub.add_parser(
        "resize",
        help="resize a running job to N nodes at the next step boundary",
        description="Ask a running job's supervisor to move the world to N nodes at the next step "
        "boundary, within its --min-nodes/--max-nodes. Only the job's user may.",
    )
    p.add_argument("run", nargs="?", help=run_help)
    p.add_argument("--job", metavar="JOBID", help=job_help)
    p.add_argument("--nodes", type=int, required=True)
    p.set_defaults(func=lambda a: _reply(a, "resize", nodes=a.nodes))
    for op, verb in (("grow", "add"), ("shrink", "remove")):
        p = sub.add_parser(
            op,
            help=f"{verb} K nodes to/from a running job at the next step boundary",
            description=f"Ask a running job's supervisor to {verb} K nodes at the next step boundary "
            "(new ranks get their state from peers; leaving ranks hand over first).",
        )
        p.add_argument("run", nargs="?", help=run_help)
        p.add_argument("--job", metavar="JOBID", help=job_help)
        p.add_argument("--by", type=int, default=1, metavar="K", help="how many nodes (default 1)")
        p.set_defaults(func=lambda a, op=op: _reply(a, op, by=a.by))
    p = sub.add_parser(
        "status",
        help="a running job's world size, nodes (and the Slurm job of each: satellites), "
        "generation, step and last resize",
    )
    p.add_argument("run", nargs="?", help=run_help)
    p.add_argument("--job", metavar="JOBID", help=job_help)
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=lambda a: _reply(a, "status"))
