"""What the hooks do to a node: a pure decision, then an executor that goes through SlurmClient.

The policy is NHC's: a failing check takes the node out with a reason we own
(``sres: <check>: <detail>``); only a node drained with our reason comes back, and only when
every check passes. A node an admin drained stays as the admin left it, whatever our checks
say. The fault class picks drain or reboot (``actions.transient`` / ``actions.persistent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from launcher.slurm.client import SlurmClient
from launcher.slurm.types import REASON_PREFIX, Node
from slurm_plugins.checks.base import CheckResult, Fault
from slurm_plugins.health_config import Actions

MAX_REASON = 200


class Kind(str, Enum):
    NONE = "none"
    DRAIN = "drain"
    REBOOT = "reboot"
    RESUME = "resume"


@dataclass(frozen=True)
class NodeDecision:
    kind: Kind
    reason: str = ""
    why: str = ""


def failure_reason(results: Sequence[CheckResult]) -> str:
    """``sres: <check>: <detail>`` for the first failure, ``(+N more)`` for the rest (pure)."""
    failed = [r for r in results if r.failed]
    first = failed[0]
    detail = first.detail if first.status.value != "timeout" else f"timeout ({first.detail})"
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    text = f"{REASON_PREFIX} {first.check}: {detail}"
    return text[: MAX_REASON - len(more)] + more


def decide(
    results: Sequence[CheckResult], node: Node | None, actions: Actions, may_resume: bool
) -> NodeDecision:
    """The action for one node after its checks ran (pure).

    ``node`` is Slurm's view (None if Slurm could not be asked: then a failure still drains);
    ``may_resume`` is True only for the health-check program, after its deep checks passed.
    """
    failed = [r for r in results if r.failed]
    if failed:
        if node is not None and node.drained and not node.drained_by_us:
            return NodeDecision(
                Kind.NONE, why=f"drained by someone else ({node.reason or 'no reason'}): left alone"
            )
        reason = failure_reason(results)
        if node is not None and node.drained_by_us and node.reason == reason:
            return NodeDecision(Kind.NONE, why="already drained for this reason")
        persistent = any(r.fault is Fault.PERSISTENT for r in failed)
        action = actions.persistent if persistent else actions.transient
        return NodeDecision(Kind.REBOOT if action == "reboot" else Kind.DRAIN, reason)
    if node is not None and node.drained_by_us:
        if "REBOOT_REQUESTED" in node.flags or "REBOOT_ISSUED" in node.flags:
            return NodeDecision(Kind.NONE, why="reboot pending: Slurm resumes it after the boot")
        if may_resume:
            return NodeDecision(Kind.RESUME, why=f"all checks pass; was: {node.reason}")
        return NodeDecision(Kind.NONE, why="drained by sres: the health-check program resumes it")
    return NodeDecision(Kind.NONE, why="healthy")


def perform(decision: NodeDecision, client: SlurmClient, node: str) -> list[str]:
    """Carry out a decision; return the nodes acted on."""
    if decision.kind is Kind.DRAIN:
        client.drain([node], decision.reason)
        return [node]
    if decision.kind is Kind.REBOOT:
        client.reboot([node], decision.reason)
        return [node]
    if decision.kind is Kind.RESUME:
        return client.resume([node])
    return []
