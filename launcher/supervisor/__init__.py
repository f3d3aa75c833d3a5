"""The supervisor: one per job, never a rank. observe -> policy (pure) -> perform, by folder.

``observe/`` reads the world into the frozen view (``observer``, ``view``, ``step_reports``,
``recovery_watch``); ``policy/`` decides on it, purely (``decisions.decide(now, observation,
state, config) -> Decision``, with ``classify``, ``replace``, ``resize``, ``requeue`` and the
``actions`` it returns); ``perform/`` carries the actions out (``executor``, its ``books`` and
``hands``, one performer module per kind of action, ``flush``, ``producers``). Beside them:
``config`` (RunConfig), ``control`` (``sres resize/grow/shrink/status``), ``relay`` (the ranks'
events), ``tickers`` (the background services' protocol) and ``loop`` (the Supervisor).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.supervisor.config import RunConfig
    from launcher.supervisor.loop import Supervisor
    from launcher.supervisor.observe.observer import silent_slots
    from launcher.supervisor.perform.books import Outcome
    from launcher.supervisor.policy.classify import await_culprit, node_verdict
    from launcher.supervisor.policy.decisions import decide
    from launcher.supervisor.policy.replace import replace

_WHERE = {
    "RunConfig": "config",
    "Outcome": "perform.books",
    "Supervisor": "loop",
    "silent_slots": "observe.observer",
    "await_culprit": "policy.classify",
    "node_verdict": "policy.classify",
    "decide": "policy.decisions",
    "replace": "policy.replace",
}
"""Loaded when first asked for (PEP 562): ``sres status`` and its kin import ``control`` from here,
and the loop's modules import torch (its store), 1.5 s of CPU each time a test polled a run."""


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


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
