"""The supervisor: one per job, never a rank. observe -> policy (pure) -> executor.

``config`` (RunConfig), ``observe`` (what was seen, one immutable Observation per tick),
``view`` (the policy's frozen input: the observation and the run's state, built purely from
the books), ``policy`` (``decide(now, observation, state, config) -> actions``, with
``fault_policy``, ``replace_policy``, ``resize`` and ``requeue_policy``), ``actions`` (one frozen
dataclass each), ``executor`` (performs them through the placement: ``books``, ``hands`` and the
``perform_*`` modules), ``recovery`` (recovery times, goodput), ``flush`` (persist now, before a
requeue), ``loop`` (the Supervisor).
"""

from launcher.supervisor.config import RunConfig
from launcher.supervisor.books import Outcome
from launcher.supervisor.loop import Supervisor
from launcher.supervisor.observe import silent_slots
from launcher.supervisor.fault_policy import await_culprit, node_verdict
from launcher.supervisor.policy import decide
from launcher.supervisor.replace_policy import replace

__all__ = [
    "RunConfig",
    "Outcome",
    "Supervisor",
    "await_culprit",
    "decide",
    "node_verdict",
    "replace",
    "silent_slots",
]
