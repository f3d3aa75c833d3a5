"""The supervisor: one per job, never a rank. observe -> policy (pure) -> perform, by folder.

``observe/`` reads the world into the frozen view (``observer``, ``view``, ``step_reports``,
``recovery_watch``); ``policy/`` decides on it, purely (``decisions.decide(now, observation,
state, config) -> Decision``, with ``classify``, ``replace``, ``resize``, ``requeue`` and the
``actions`` it returns); ``perform/`` carries the actions out (``executor``, its ``books`` and
``hands``, one performer module per kind of action, ``flush``, ``producers``). Beside them:
``config`` (RunConfig), ``control`` (``sres resize/grow/shrink/status``), ``relay`` (the ranks'
events), ``tickers`` (the background services' protocol) and ``loop`` (the Supervisor).
"""

from launcher.supervisor.config import RunConfig
from launcher.supervisor.perform.books import Outcome
from launcher.supervisor.loop import Supervisor
from launcher.supervisor.observe.observer import silent_slots
from launcher.supervisor.policy.classify import await_culprit, node_verdict
from launcher.supervisor.policy.decisions import decide
from launcher.supervisor.policy.replace import replace

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
