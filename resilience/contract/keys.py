"""The names of a run's store keys. Only the store's channels (:mod:`resilience.contract.channels`)
read this module: everyone else goes through them, so no two processes can spell a key differently.

Layout (G: a generation, S: a slot, R: a rank, N: a node index):

============================ =============================================================
``plan/G``                   :class:`~resilience.contract.messages.Plan` (supervisor)
``plan-change/G``            :class:`~resilience.contract.messages.PlanChange`: plan G from G-1
``pg/G/...``                 the process group of generation G (torch's own keys)
``join/G``, ``joined/G``      members arrived in G (counter); the last one arrived
``pause/G``, ``pause-step/G`` a resize asked to leave G; the first step no rank may start
``report/G/S``, ``report-at/G/I`` a report, by slot and by its order ``I``
``report-seq/G``, ``report-ready/G``  the reports' order; their count
``recovery/G``, ``batch/G``, ``first-step/G``  how G recovered; its batch; its first step's time
``hb/S``, ``ready/S``        heartbeats (counter); warm and waiting for a plan
``compute/G/S``              recent per-step times
``tier-addr/S``              the slot's neighbour-copy server
``tier-flush*``              persist-now requests and answers
``rank-events``, ``rank-event/I``  events from ranks for the supervisor's log
``progress``, ``stats/G``    the newest committed step; the run's median step time
``preempt``, ``reclaim*``    a rank caught the preemption signal; lent nodes taken back
``inject-*``                 fault injection: fired once, node kills, slow nodes, spare kills
``batch-producer/N``         a rank of node N asked for the node's batch producer (``-asks``: how often)
``shutdown``                 the run is over
============================ =============================================================
"""

from __future__ import annotations

SHUTDOWN = "shutdown"
PROGRESS = "progress"
PREEMPT = "preempt"
RECLAIMS = "reclaim-count"
RANK_EVENTS = "rank-events"
NODE_KILLS = "inject-node-count"
LINK_FAULTS = "inject-link-count"
CHILD_KILL = "inject-supervisor-child"
FLUSH_SEQ = "tier-flush-seq"
FLUSH_REQUEST = "tier-flush"
REQUEUE_SEQ = "requeue-seq"
REQUEUE_NOTICE = "requeue"
BATCH_PRODUCER_ASKS = "batch-producer-asks"


def plan(generation: int) -> str:
    return f"plan/{generation}"


def plan_change(generation: int) -> str:
    return f"plan-change/{generation}"


def pg_prefix(generation: int) -> str:
    return f"pg/{generation}/"


def join(generation: int) -> str:
    return f"join/{generation}"


def joined(generation: int) -> str:
    """Set by the last member to join G: what the others wait on."""
    return f"joined/{generation}"


def pause(generation: int) -> str:
    return f"pause/{generation}"


def pause_step(generation: int) -> str:
    return f"pause-step/{generation}"


def report(generation: int, slot: str) -> str:
    return f"report/{generation}/{slot}"


def report_at(generation: int, seq: int) -> str:
    """Report number ``seq`` of G (the same report as under its slot): read in order, one per
    report, however many ranks the run has."""
    return f"report-at/{generation}/{seq}"


def report_seq(generation: int) -> str:
    return f"report-seq/{generation}"


def report_ready(generation: int) -> str:
    """Bumped after a report is written: what the supervisor polls (the sequence counter moves
    before the report exists)."""
    return f"report-ready/{generation}"


def recovery(generation: int) -> str:
    return f"recovery/{generation}"


def batch(generation: int) -> str:
    return f"batch/{generation}"


def first_step(generation: int) -> str:
    return f"first-step/{generation}"


def stats(generation: int) -> str:
    return f"stats/{generation}"


def heartbeat(slot: str) -> str:
    return f"hb/{slot}"


def ready(slot: str) -> str:
    return f"ready/{slot}"


def compute(generation: int, slot: str) -> str:
    return f"compute/{generation}/{slot}"


def tier_address(slot: str) -> str:
    return f"tier-addr/{slot}"


def flush_done(request: int, rank: int) -> str:
    return f"tier-flush-done/{request}/{rank}"


def requeue_hooked(slot: str) -> str:
    return f"requeue-hooked/{slot}"


def batch_producer(node: int) -> str:
    return f"batch-producer/{node}"


def requeue_done(notice: int, slot: str) -> str:
    return f"requeue-done/{notice}/{slot}"


def rank_event(index: int) -> str:
    return f"rank-event/{index}"


def reclaim(slot: str) -> str:
    return f"reclaim/{slot}"


def fired(index: int) -> str:
    return f"inject-fired/{index}"


def node_kill(node: int) -> str:
    return f"inject-node/{node}"


def link_fault(number: int) -> str:
    return f"inject-link/{number}"


def slow(node: int) -> str:
    return f"inject-slow/{node}"
