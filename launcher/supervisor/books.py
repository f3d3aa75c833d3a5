"""The run's mutable books, and what performing an action ends with.

Only the executor and its performers change the books; the policy sees them frozen, through
:func:`launcher.supervisor.view.run_state`, and the Observer only reads the slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe import SlotState
from launcher.supervisor.policy import ErrorAt, FaultState
from launcher.supervisor.resize import ResizeState
from resilience.contract.messages import Plan, Report


@dataclass
class Outcome:
    ok: bool
    reason: str = ""
    events: list[dict] = field(default_factory=list)
    requeued: bool = False


@dataclass
class Books:
    """The run's mutable facts, changed only by the executor."""

    slots: dict[str, SlotState] = field(default_factory=dict)
    plan: Plan | None = None
    spare_nodes: list[int] = field(default_factory=list)
    dead_nodes: set[int] = field(default_factory=set)
    process_faults: dict[int, int] = field(default_factory=dict)
    origin: dict[int, str] = field(default_factory=dict)  # node -> how it joined after the start
    faults: int = 0
    restarts: int = 0
    respawns: int = 0
    collateral_since: float | None = None
    fault: FaultState | None = None
    first_culprit: Report | None = None
    resize: ResizeState | None = None
    last_resize: dict | None = None
    next_refill: float = 0.0
    standby: set[str] = field(default_factory=set)
    """Slots of live standby processes that have not taken over a rank (a dead one is dropped
    when an observation says it ended)."""
    standbys_started: int = 0
    announced: set[str] = field(default_factory=set)
    finished: bool = False
    changed_at: float = 0.0
    asked_nodes: int | None = None
    errors_seen: set[ErrorAt] = field(default_factory=set)
    """Every fault's own exception, where it was raised (a recurrence fails the run)."""

    @classmethod
    def for_run(cls, config: RunConfig) -> "Books":
        """The books before anything starts: the spare nodes are the ones after the run's nodes."""
        return cls(spare_nodes=list(range(config.nodes, config.nodes + config.spares)))
