"""Every event type of ``events.jsonl``: its name, what it means, its fields.

One frozen :class:`EventType` per event. The writer (:meth:`EventLog.emit
<launcher.observability.events.EventLog.emit>`) refuses a name or a field not declared here,
and a declared field that is neither optional nor given; ``docs/reference/events.md`` is
generated from this table (``python docs/generate.py``). Field names are a contract: code
outside the project reads them (``sres report``, metrics, chaos, simulate, submitit's
``job.events()``, users' own scripts), so a field is added or documented here, never renamed.

``source`` says who writes the event: the supervisor itself, or a rank through the store
(:class:`resilience.contract.messages.RankEvent`); either way the supervisor's
:class:`~launcher.observability.events.EventLog` writes the line.
"""

from __future__ import annotations

from launcher.observability.event_schema import COMMON, RANK, SUPERVISOR, EventType, Field
from launcher.observability.rank_event_types import RANK_EVENT_TYPES

__all__ = ["BY_NAME", "COMMON", "EVENT_TYPES", "RANK", "SUPERVISOR", "EventType", "Field"]


def _node_fields(node: str) -> tuple[Field, Field]:
    return Field("node", "int", f"the {node}'s number in the run"), Field("host", "str", "its host name")


_RECOVERY_PARTS = (
    Field("reform_s", "float", "from the fault (a resize: its start, less `boundary_s`) to the group formed"),
    Field("transfer_s", "float", "from the group formed to the state in place"),
    Field("first_step_s", "float", "from the state in place to the first step done"),
)

EVENT_TYPES: tuple[EventType, ...] = (
    EventType(
        "start",
        "The supervisor started; a requeued job appends another (a run's timeline is from its last).",
        SUPERVISOR,
        (
            Field("nodes", "int", "nodes holding ranks at the start"),
            Field("procs_per_node", "int", "rank processes per node"),
            Field("spares", "int", "warm spare nodes"),
            Field("world_size", "int", "ranks"),
            Field("command", "list[str]", "the training command every rank runs"),
            Field("injections", "list[str]", "injected faults (`--inject` specs)"),
            Field("restart_count", "int", "the Slurm job's restarts before this one"),
            Field("hosts", "list[str]", "host of each node, by number (spares last)"),
        ),
    ),
    EventType(
        "metrics",
        "Where the live metrics are (`--metrics-port`, `--metrics-textfile`).",
        SUPERVISOR,
        (
            Field("port", "int | None", "the HTTP port"),
            Field("url", "str | None", "the address to scrape"),
            Field("textfile", "str | None", "the textfile rewritten in place"),
        ),
    ),
    EventType(
        "generation",
        "A plan was published: its ranks form this generation.",
        SUPERVISOR,
        (
            Field("generation", "int", "its number, from 1"),
            Field("world_size", "int", "ranks in it"),
            Field("replaced", "list[int]", "ranks that have a new process in it"),
        ),
    ),
    EventType(
        "fault",
        "A rank was lost or raised: one per lost rank, and one for the culprit's own error.",
        SUPERVISOR,
        (
            Field("kind", "str", "`kill`, `exit N`, `hang`, `node` (lost), or `exception` (its own error)"),
            Field("rank", "int", "the rank"),
            *_node_fields("rank's node"),
            Field("step", "int", "the step in progress (the last step done + 1)"),
            Field("generation", "int", "the generation it ended"),
            Field("why", "str", "why the node must leave the job (the drain reason)", optional=True),
            Field("message", "str", "`exception`: the error's message", optional=True),
            Field(
                "recurred", "bool", "`exception`: true, the same error at the same step again", optional=True
            ),
        ),
    ),
    EventType(
        "replaced",
        "A lost rank has a new process in the next generation.",
        SUPERVISOR,
        (
            Field("rank", "int", "the rank"),
            Field("slot", "str", "its new process's slot"),
            *_node_fields("new process's node"),
            Field(
                "how",
                "str",
                "`forked` (from its machine's fork server), `respawn` (started cold), `standby`, or its "
                "node's source: `spare`, `idle`, `satellite`, ...",
            ),
        ),
    ),
    EventType(
        "drained",
        "A bad node was drained in Slurm (reason `sres: why`) and left the job.",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("why", "str", "the drain reason"),
            Field("seconds", "float", "the drain took"),
        ),
    ),
    EventType(
        "drain-failed",
        "A bad node could not be drained; the run goes on without it.",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("why", "str", "the drain reason"),
            Field("error", "str", "what failed"),
        ),
    ),
    EventType(
        "node-released",
        "A node left the run.",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field(
                "why", "str", "`fault` (drained), `preempted` (Slurm takes it back) or `request` (a shrink)"
            ),
            Field("detail", "str", "`fault`: the drain reason", optional=True),
            Field("job", "str", "the Slurm job its ranks ran in (a satellite: cancelled)", optional=True),
        ),
    ),
    EventType(
        "node-added",
        "A node joined the run (a spare for a fault, or a growing world).",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("how", "str", "`idle` (the job held it), `satellite`, `expansion` or `local` (simulated)"),
            Field("seconds", "float", "getting the node took"),
            Field(
                "forked",
                "int",
                "how many of its processes its fork server forks (the rest start cold, each with a "
                "`fork-fallback` event)",
                optional=True,
            ),
            Field("returned", "bool", "true: drained earlier and healthy again", optional=True),
            Field("job", "str", "the Slurm job its ranks run in", optional=True),
        ),
    ),
    EventType(
        "spare-lost",
        "A spare node's waiting process died: it can no longer take a node's ranks.",
        SUPERVISOR,
        (Field("node", "int", "the spare node's number"), Field("slot", "str", "the process that died")),
    ),
    EventType(
        "network-fault",
        "An injected network fault was done to a node's link (`--inject cut:N:...` and its kin; nodes "
        "with networks of their own, `SRES_NETNS`): its processes live on, and what follows is found "
        "as a real fault would be.",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field(
                "kind",
                "str",
                "`cut`, `cut-supervisor`, `drop-out`, `flap`, `slow-link`, `lossy`, `delay`, or "
                "`isolate-supervisor` (one event for each node it cut off)",
            ),
            Field("spec", "str", "the `--inject` spec"),
            Field("what", "str", "what was done, in words"),
        ),
    ),
    EventType(
        "standby-ready",
        "A warm standby process is ready to take over a rank on its node (`--standby`).",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("slot", "str", "the standby's slot"),
            Field("seconds", "float", "from its start to warm (the process says when it was warm)"),
        ),
    ),
    EventType(
        "straggler",
        "A rank computed slower than the others for `--straggler-steps` steps.",
        SUPERVISOR,
        (
            Field("rank", "int", "the slow rank"),
            *_node_fields("rank's node"),
            Field("score", "float", "its compute time over the median rank's"),
            Field("step", "int", "the step it was seen at"),
            Field("steps", "int", "the streak's length (`--straggler-steps`)"),
            Field("action", "str", "`replace`, `none` or `kept: no spare`"),
        ),
    ),
    EventType(
        "waiting",
        "No node can take the lost ranks and the world may not shrink: the fault waits for one.",
        SUPERVISOR,
        (
            Field("why", "str", "why it waits"),
            Field("timeout_s", "float", "how long at most (`--resize-timeout`); `t` is when it started"),
            Field("world_size", "int", "ranks left"),
        ),
    ),
    EventType(
        "request",
        "A control request (`sres resize/grow/shrink`) was answered.",
        SUPERVISOR,
        (
            Field("request", "int", "the request's number"),
            Field("ok", "bool", "accepted"),
            Field("message", "str", "the answer"),
        ),
    ),
    EventType(
        "resize-abandoned",
        "A resize under way was given up; the world keeps its size.",
        SUPERVISOR,
        (Field("to_nodes", "int", "the nodes it aimed at"), Field("why", "str", "why it was abandoned")),
    ),
    EventType(
        "resize",
        "A generation of another world size took its first step (seconds from the decision).",
        SUPERVISOR,
        (
            Field("from_world", "int", "ranks before"),
            Field("to_world", "int", "ranks after"),
            Field("why", "str", "`fault`, `request`, `idle` (grew into lent nodes) or `preempted`"),
            Field("generation", "int", "the new generation"),
            Field("step", "int", "the step it resumed after (-1: none)"),
            Field("seconds", "float", "from the decision (or the pause) to the first step"),
            Field("boundary_s", "float | None", "waiting for every rank to leave at the step boundary"),
            *_RECOVERY_PARTS,
            Field("accumulation", "int | None", "gradient accumulation steps in the new world"),
            Field("global_batch", "int | None", "the global batch in the new world"),
            Field("lr_scale", "float | None", "the learning rate's factor in the new world"),
            Field("jobs", "dict[str, str]", "host -> the Slurm job its ranks run in", optional=True),
        ),
    ),
    EventType(
        "recovered",
        "A fault's generation took its first step: one per fault it answered.",
        SUPERVISOR,
        (
            Field("generation", "int", "the generation that recovered"),
            Field("step", "int", "the step it resumed after (-1: none, training starts over)"),
            Field("source", "str", "where the state came from: `self`, `peer` or a tier's name"),
            Field("bytes", "int", "state bytes moved"),
            Field("seconds", "float", "from the fault to the first step after it"),
            Field("steps_lost", "int", "steps done again"),
            Field("release_s", "float | None", "from the fault to the last survivor leaving"),
            *_RECOVERY_PARTS,
        ),
    ),
    EventType(
        "requeue",
        "The Slurm job is requeued; this process's run ends.",
        SUPERVISOR,
        (
            Field("why", "str", "what ended the run"),
            Field("cause", "str", "`fault` (no node left), `preemption` or `time-limit`"),
            Field("restart_count", "int", "the job's restarts before this one"),
            Field("saved_step", "int | None", "the step persisted before the requeue"),
        ),
    ),
    EventType(
        "finished",
        "Every rank finished training.",
        SUPERVISOR,
        (
            Field("faults", "int", "faults in this run"),
            Field("generations", "int", "generations formed"),
            Field("steps", "int", "steps done"),
            Field("goodput", "float | None", "the share of wall time that became steps"),
            Field("wall_s", "float", "from the start event to the end"),
            Field("median_step_s", "float | None", "the median step time"),
            Field("goodput_by_cause", "dict[str, float]", "the wall time's seconds by cause (summing to it)"),
            Field("state_digests", "dict[str, str]", "rank -> the fingerprint of its final state"),
        ),
    ),
    EventType(
        "failed",
        "The run failed.",
        SUPERVISOR,
        (
            Field("reason", "str", "why ('interrupted': stopped by SIGINT, as Ctrl-C or a cancel does)"),
            Field("faults", "int", "faults in this run"),
            Field("rank", "int", "the rank whose error ended it", optional=True),
            Field("error_type", "str", "that error's class", optional=True),
            Field("traceback", "str", "that error's traceback", optional=True),
            Field("errors", "dict[str, str]", "rank -> its own error's traceback, lowest 16", optional=True),
        ),
    ),
    EventType(
        "flushed",
        "Every rank persisted the newest commit now (preemption, requeue).",
        SUPERVISOR,
        (Field("step", "int", "the step persisted"), Field("tier", "str", "where (`persistent`)")),
    ),
    EventType(
        "flush-failed",
        "Persisting the newest commit now failed; the last periodic copy serves.",
        SUPERVISOR,
        (Field("errors", "list[str]", "the ranks' errors, or `timeout`"),),
    ),
    EventType(
        "dropped-input",
        "Input from outside refused: a hello or store value without the run's secret, a non-rank event.",
        SUPERVISOR,
        (Field("channel", "str", "`liveness`, `rank-event` or `store`"), Field("why", "str", "why")),
    ),
    EventType(
        "batch-producer",
        "A node's batch producer was started (its ranks asked for it) or started again (it died).",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("how", "str", "`started` or `restarted`"),
            Field(
                "exit_code",
                "int",
                "how the one before ended (negative: killed by that signal)",
                optional=True,
            ),
        ),
    ),
    EventType(
        "fork-server",
        "A machine's fork server was started (its first rank was asked for), started again (it died) "
        "or is ready to fork ranks.",
        SUPERVISOR,
        (
            *_node_fields("node"),
            Field("how", "str", "`started`, `restarted` or `ready`"),
            Field(
                "seconds",
                "float",
                "`ready`: from its start to ready (process or step, imports, the script up to "
                "`resilience.run`, warm-up)",
                optional=True,
            ),
            Field(
                "exit_code",
                "int",
                "`restarted`: how the one before ended (negative: killed by that signal)",
                optional=True,
            ),
        ),
    ),
    EventType(
        "fork-fallback",
        "A rank process started cold on a machine whose fork server could not fork it.",
        SUPERVISOR,
        (
            Field("slot", "str", "the process's slot"),
            *_node_fields("node"),
            Field("why", "str", "e.g. `its fork server was not ready in 30 s`, `... exited with -9`"),
        ),
    ),
) + RANK_EVENT_TYPES

BY_NAME: dict[str, EventType] = {e.name: e for e in EVENT_TYPES}
