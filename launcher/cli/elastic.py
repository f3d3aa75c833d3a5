"""The commands that resize a running job: ``sres resize RUN --nodes N``, ``sres grow RUN --by K``,
``sres shrink RUN --by K``, ``sres status RUN``. The elastic flags of ``sres run`` are declared
with the other run options (``launcher.run.options``)."""

from __future__ import annotations

import argparse
import json

from launcher.errors import ConfigError
from launcher.supervisor import control


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
    p = s.get("protection")
    if p:
        lines.append(
            f"protection   tiers copy every {p['every']} step(s), {p['steps_at_risk']} step(s) at risk "
            f"({100 * p['overhead']:.1f}% of step time, budget {100 * p['budget']:g}%; "
            f"since step {p['step']})"
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
