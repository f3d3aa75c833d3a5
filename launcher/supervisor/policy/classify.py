"""A fault classified: which nodes must go, who is the culprit, whether it is deterministic. Pure.

:func:`open_fault` turns what an observation lost (processes, a rank's exception) into the
fault's record and the nodes to kill; :func:`node_verdict` judges a node from the evidence its
placement gathered; :func:`await_culprit` holds a fault that so far is only collateral
errors. Where the lost ranks then go is :mod:`launcher.supervisor.policy.replace`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from launcher.supervisor.policy.actions import Action, Fail, KillNode, OpenFault
from launcher.supervisor.policy.requeue import requeue_or_fail
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe.view import ErrorAt, NodeEvidence, Observation, RunState
from resilience.contract.messages import STUCK_EXIT, Report

INJECTED_NODE_LOSS = "node lost (injected fault)"
SPARE_PROCESS_DIED = "a warm spare process of this node died"
RECLAIMED = "Slurm took the lent node back (preempted)"
UNREACHABLE = "unreachable: no answer over the network (its processes may be alive; they fence themselves)"
ISOLATED = (
    "the supervisor reaches none of the run's {nodes} other nodes: its own link is cut (no node is drained; "
    "their ranks fence themselves within their lease)"
)
ISOLATED_REQUEUE_WAIT_S = 600.0
"""How long an isolated supervisor keeps asking Slurm to requeue the job: its link may come back
(a switch rebooting, a flapping port), and nothing else can requeue a ``--no-kill`` job whose
batch host Slurm sees down (Slurm keeps it RUNNING, checked on the test cluster)."""
COLLATERAL_GRACE_S = 1.0
"""How long reports of collateral errors alone wait for the process death that caused them."""


def open_fault(obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """Classify a fault: which nodes must go (killed, later drained), who is the culprit."""
    counts, bad = _bad_nodes(obs, state, config)
    lost = {rank: "node" if state.node_of(rank) in bad else how for rank, how in obs.lost.items()}
    # A node that must go takes all its ranks, also those whose loss is not seen yet: a node's
    # liveness connections close one by one, and at 1,024 ranks a tick saw one rank of a lost node;
    # its other ranks, left in the new plan, failed it again with no spare left (the harness).
    lost |= {rank: "node" for rank in state.members if rank not in lost and state.node_of(rank) in bad}
    culprit = None if lost else min(obs.errors.values(), key=lambda r: (r.collateral, r.seq))
    where = error_at(culprit)
    recurred = where is not None and where in state.errors_seen
    # A rank stuck in the generation an earlier fault ended (in gloo's new_group, which cannot be
    # aborted) ends itself: the same fault, seen late; it failed runs at --max-restarts 1 in CI.
    stuck = bool(lost) and all(how == f"exit {STUCK_EXIT}" for how in lost.values())
    actions: list[Action] = [OpenFault(obs.seen_t, lost, bad, culprit, counts, recurred, counted=not stuck)]
    actions += [KillNode(node, why) for node, why in sorted(bad.items())]
    if recurred:
        assert culprit is not None and where is not None  # recurred: where = error_at(culprit) was seen
        said = (
            culprit.message.splitlines()[0] if culprit.message else culprit.error_type
        )  # the traceback has the rest
        actions.append(
            Fail(
                f"rank {culprit.rank} raised {said} at step {where.step} again after recovering from "
                f"it: the error is deterministic; not retrying",
                culprit,
                own_errors(obs.errors.values()),
            )
        )
    elif not stuck and state.restarts + 1 > config.max_restarts:
        actions.append(
            Fail(f"gave up after {config.max_restarts} restart(s)", errors=own_errors(obs.errors.values()))
        )
    return actions


def cut_off_from_every_node(obs: Observation, state: RunState) -> bool:
    """Whether no node of the run answers the supervisor (each one's evidence: unreachable). Then
    the common cause is the supervisor's own link, not every node's at once: the nodes are not
    to blame and no spare could be reached either. The node the supervisor runs on answers it
    whatever its link does, and is left out. One other node alone cannot tell the two apart,
    unless Slurm could not be asked either: then it is the supervisor's link too."""
    others = _others(obs, state)
    seen = [obs.evidence[n] for n in others if n in obs.evidence]
    if not others or len(seen) < len(others) or any(e.reachable for e in seen):
        return False
    return len(others) > 1 or not any(e.slurm_answers for e in seen)


def _others(obs: Observation, state: RunState) -> list[int]:
    """The run's nodes but the one the supervisor runs on (none when it runs apart)."""
    return sorted(n for n in _run_nodes(state) if not obs.evidence_of(n).runs_supervisor)


def _run_nodes(state: RunState) -> set[int]:
    """The nodes the run holds: its members' and its spares'."""
    return {state.node_of(rank) for rank in state.members} | set(state.spare_nodes)


def isolated(obs: Observation, state: RunState, config: RunConfig) -> Action:
    """Nothing can go on from here: every rank has fenced itself or will. A requeue resumes from
    the tiers (the nodes keep their RAM tier; none is drained); outside a batch job, one line."""
    why = ISOLATED.format(nodes=len(_others(obs, state)))
    return requeue_or_fail(why, config, wait_s=ISOLATED_REQUEUE_WAIT_S) if state.requeueable else Fail(why)


def own_errors(reports: Iterable[Report]) -> tuple[Report, ...]:
    """The ranks' own errors (not a peer's fault seen by a survivor), lowest rank first."""
    own = (r for r in reports if r.kind == "error" and not r.collateral and r.origin == "own")
    return tuple(sorted(own, key=lambda r: r.rank))


def _bad_nodes(obs: Observation, state: RunState, config: RunConfig) -> tuple[dict[int, int], dict[int, str]]:
    """The per-node process fault counts after this fault, and the nodes that must go (why)."""
    counts = dict(state.process_faults)
    bad: dict[int, str] = {}
    # Every rank lost at once has a common cause (the program, the job): it is no node's fault.
    common = len(state.members) > 1 and set(obs.lost) >= set(state.members)
    # A rank that ended itself because it could not leave an ended generation (STUCK_EXIT) lost
    # nothing of its node's own: the fault that ended the generation was elsewhere.
    blamed = {state.node_of(r) for r, how in obs.lost.items() if how != f"exit {STUCK_EXIT}"}
    for node in sorted(
        {state.node_of(r) for r in obs.lost} - state.dead_nodes
    ):  # injected kills: already dead
        if not common and node in blamed:
            counts[node] = counts.get(node, 0) + 1
        why = node_verdict(
            obs.evidence_of(node),
            counts.get(node, 0) if not common else 0,
            config.node_fault_after,
        )
        if why is not None:
            bad[node] = why
    return counts, bad


def error_at(report: Report | None) -> ErrorAt | None:
    """Where a rank's own exception was raised; None for a peer's fault seen by a survivor
    (collateral) and for an exception raised outside ``ctx.steps()`` (no step). Pure.

    Object addresses are left out of the message: the same error names another address in each
    process (``<ProcessGroup object at 0x7f..>``), which hid its recurrence (retried ten times)."""
    if report is None or report.collateral or report.origin != "own" or report.step is None:
        return None
    return ErrorAt(report.error_type, _ADDRESS.sub("0x?", report.message), report.step)


_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def node_verdict(evidence: NodeEvidence, process_faults: int, limit: int) -> str | None:
    """Why a node that just lost a rank must leave the job, or None for a process fault. Pure.

    The returned text becomes the drain reason (after ``sres:``), so it says what was seen.
    """
    if evidence.reclaimed:
        return RECLAIMED
    if not evidence.reachable:
        return UNREACHABLE
    if not evidence.slurmd_answers:
        return "slurmd not responding"
    if not evidence.slurm_usable:
        detail = f" ({evidence.slurm_reason})" if evidence.slurm_reason else ""
        return f"slurm reports {evidence.slurm_state or 'node unusable'}{detail}"
    if process_faults >= limit:
        return f"repeated failure: {process_faults} process faults on this node"
    return None


def await_culprit(
    lost: Mapping[int, str],
    errors: Mapping[str, Report],
    collateral_since: float | None,
    now: float,
    grace_s: float = COLLATERAL_GRACE_S,
) -> bool:
    """Whether to hold a fault that so far is only collateral errors (collectives that lost a
    peer): a rank's SIGKILL reaches its peers' sockets as fast as it reaches us, and a survivor's
    report can come first. Handled as an exception at once, it would cost a generation with no
    one replaced, then a second fault for the real loss. Waits at most ``grace_s``. Pure."""
    if lost or not errors or not all(r.collateral for r in errors.values()):
        return False
    return collateral_since is None or now - collateral_since < grace_s
