"""What a fault kind is (:class:`FaultKind`): declared once, read by the ``--inject`` parser, its
help, the random schedule and the reference page (:mod:`resilience.contract.injections`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Target = Literal["rank", "node", "job"]
Where = Literal["step", "commit", "copy", "capture", "transfer"]
Effect = Literal[
    "sigkill",
    "sigstop",
    "hold-gil",
    "raise",
    "stall",
    "slow",
    "corrupt-ram",
    "fill-disk",
    "free-disk",
    "kill-node",
    "kill-spare",
    "break-link",
]
SUPERVISOR_EFFECTS = ("kill-node", "kill-spare", "break-link")
"""Effects a rank asks the supervisor for (through the store) instead of carrying out itself."""
Random = Literal["default", "optional", "never"]


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault ``--inject`` can ask for, declared once: the parser, the spec's text,
    ``--inject help``, the random schedule's choices, the reference page and where a rank fires
    it are all read from here, so a new kind is one entry (and its effect, if it is a new one)."""

    name: str
    target: Target
    """``rank``: ``:rank=R``; ``node``: ``node:N`` or ``node:rank=R``; ``job``: nobody named (every
    rank, whoever sends, or rank 0 asking the supervisor)."""
    fires: Where
    """Where a rank fires it: as it starts a step, inside a commit, half-way through a buddy copy,
    half-way through a snapshot, or while sending state in a recovery."""
    effect: Effect
    """What is done: a signal to the rank itself, an exception, a stall, a file broken or filled,
    or a request that the supervisor acts (:data:`SUPERVISOR_EFFECTS`)."""
    doc: str
    generation: bool = False
    """``gen=G`` may stand for ``step=S``: fires as the target enters generation G (recovery)."""
    random: Random = "optional"
    """In ``random:`` schedules: by default, when named in ``kinds=``, or never."""
    options: tuple[str, ...] = ()
    """More fields of its spec, after the target (``factor=F``)."""

    @property
    def syntax(self) -> str:
        more = "".join(f":{o}" for o in self.options)
        if self.name == "node":
            return "node:N:step=S | node:rank=R:step=S" + (" (gen=G for step=S)" if self.generation else "")
        if self.target == "node":
            return f"{self.name}:N{more}:step=S"
        target = ":rank=R" if self.target == "rank" else ""
        return f"{self.name}{target}{more}:step=S" + (" (gen=G for step=S)" if self.generation else "")

    @property
    def performer(self) -> str:
        return "supervisor" if self.effect in SUPERVISOR_EFFECTS else "rank"
