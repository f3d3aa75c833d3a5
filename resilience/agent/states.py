"""The states of a rank process, written down (as torch elastic documents its ``WorkerState``).

::

    STARTING --warm--> WAITING --plan with this slot--> JOINING --all joined--> FORMING
       FORMING --groups formed--> RECOVERING --state in place--> TRAINING
       TRAINING --train returned, every rank done--> DONE
       TRAINING/FORMING/RECOVERING --error, peer lost, pause--> LEAVING --reported, torn down--> WAITING
       JOINING --a newer plan superseded it--> WAITING
       WAITING --shutdown--> DONE

A process never goes back to STARTING: imports, the warm-up and everything kept
(:class:`~resilience.agent.kept.Kept`) survive every generation; that is what makes a
recovery cost seconds. A warm spare or standby is a process that stays in WAITING until a
plan gives it a rank.
"""

from __future__ import annotations

import enum


class RankState(enum.Enum):
    STARTING = "starting"
    """Importing torch and the user's script, warming up: not usable yet."""
    WAITING = "waiting"
    """Warm (the supervisor sees ``ready``): waiting for a plan that includes this slot."""
    JOINING = "joining"
    """In generation G's plan: waiting until every member has joined."""
    FORMING = "forming"
    """Forming G's process groups (the training group and the state group)."""
    RECOVERING = "recovering"
    """Agreeing on the step and moving what is missing: peers, buddies or the tiers."""
    TRAINING = "training"
    """In ``train``: steps and commits (the commit pipeline runs in the background)."""
    LEAVING = "leaving"
    """G ended for this rank (its own error, a peer's fault, a pause for a resize): reporting
    and tearing the groups down."""
    DONE = "done"
    """Training finished everywhere, or the run shut down: the process exits."""
