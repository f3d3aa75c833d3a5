"""The event types ranks write (through the store; the supervisor checks each against this table
before it writes the line). The supervisor's own are in :mod:`launcher.observability.event_types`,
which lists both."""

from __future__ import annotations

from launcher.observability.event_schema import RANK, RANK_FIELD, EventType, Field

RANK_EVENT_TYPES: tuple[EventType, ...] = (
    EventType(
        "checkpoint-saved",
        "Rank 0 wrote a commit to a tier that announces its saves.",
        RANK,
        (
            RANK_FIELD,
            Field("tier", "str", "the tier"),
            Field("step", "int", "the step"),
            Field("seconds", "float", "the write took"),
        ),
    ),
    EventType(
        "tier-warning",
        "A tier's save failed (said once until it works again, or each time where the tier asks), "
        "or a rank's shared copy of a step will not restore.",
        RANK,
        (
            RANK_FIELD,
            Field("tier", "str", "the tier"),
            Field("step", "int", "the step"),
            Field("error", "str", "what failed"),
            Field("message", "str", "what it means for the run"),
        ),
    ),
    EventType(
        "tier-resumed",
        "A tier that was failing saved again.",
        RANK,
        (RANK_FIELD, Field("tier", "str", "the tier"), Field("step", "int", "the step saved")),
    ),
    EventType(
        "checkpoint-invalid",
        "A copy found while restoring was refused (checksum, manifest, another job's).",
        RANK,
        (
            RANK_FIELD,
            Field("tier", "str", "the tier it was in"),
            Field("owner", "int", "the rank whose copy it is"),
            Field("step", "int", "its step"),
            Field("reason", "str", "why it was refused"),
        ),
    ),
    EventType(
        "restored",
        "A generation's state came from the checkpoint tiers (no peer held it); from rank 0.",
        RANK,
        (
            RANK_FIELD,
            Field("step", "int", "the step restored"),
            Field("generation", "int", "the generation"),
            Field("source", "str", "the most expensive tier that served a rank"),
            Field("tiers", "dict[str, str]", "rank -> the tier it loaded from"),
            Field("seconds", "float", "the restore took"),
            Field("bytes", "int", "bytes moved"),
            Field("borrowed", "dict[str, int]", "rank -> the rank whose replicated state it loaded"),
        ),
    ),
    EventType(
        "inexact",
        "Ranks resumed without their own random streams and data positions: no longer bitwise exact.",
        RANK,
        (
            Field("step", "int", "the step resumed after"),
            Field("ranks", "list[int]", "the ranks"),
            Field("why", "str", "why"),
        ),
    ),
    EventType(
        "changed-after-commit",
        "Registered state changed after the commit block; taken again at the next step.",
        RANK,
        (RANK_FIELD, Field("step", "int", "the step"), Field("names", "list[str]", "the registered names")),
    ),
    EventType(
        "reclaim-signal",
        "A rank on a lent node got Slurm's signal that the node is being taken back.",
        RANK,
        (Field("slot", "str", "the rank process's slot"),),
    ),
    EventType(
        "first-batch",
        "A rank's first batch after entering `train` (a start, a recovery, a resize): from the node's "
        "batch cache or made from the source.",
        RANK,
        (
            RANK_FIELD,
            Field("step", "int", "the step"),
            Field("generation", "int", "the generation"),
            Field("source", "str", "`cache` (the producer had made it) or `source` (made by the rank)"),
            Field("seconds", "float", "from asking to having it"),
        ),
    ),
    EventType(
        "batch-corrupt",
        "A batch cache entry failed its checks (checksum, another job's, torn): made again from the "
        "source, never trained on.",
        RANK,
        (RANK_FIELD, Field("step", "int", "the step"), Field("error", "str", "what was wrong")),
    ),
    EventType(
        "protection",
        "The ranks agreed how often the RAM and neighbour tiers copy a commit, under the protection "
        "budget (`--protection-budget`); said at a generation's first decision and when it changes.",
        RANK,
        (
            Field("step", "int", "the commit it was agreed at (it applies from there)"),
            Field("every", "int", "the tiers copy the steps that are multiples of this"),
            Field("steps_at_risk", "int", "the most steps a fault redoes when these tiers serve it"),
            Field("overhead", "float", "the share of step time the copies take at this cadence (estimated)"),
            Field("budget", "float", "the share they may take"),
            Field("cost_s", "float", "CPU seconds of the copies per protected commit, the slowest rank's"),
            Field("step_s", "float", "the median step, rank 0's"),
        ),
    ),
)
