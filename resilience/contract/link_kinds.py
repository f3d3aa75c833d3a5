"""The network faults ``--inject`` can ask for: done by the supervisor to a node's link (``sres run``
on nodes with networks of their own, ``SRES_NETNS``: :mod:`launcher.placement.links`) while the
node's processes live on, and found as a real one would be."""

from __future__ import annotations

from resilience.contract.fault_kind import FaultKind

LINK_KINDS = (
    FaultKind(
        "cut",
        "node",
        "step",
        "break-link",
        "node N's link goes down: nothing in or out, nothing refused (a pulled cable); for=D brings "
        "it back after D s (0: never)",
        random="optional",
        options=("for=D",),
    ),
    FaultKind(
        "cut-supervisor",
        "node",
        "step",
        "break-link",
        "node N and the supervisor's node lose each other; its peers still reach it (a management "
        "network down, the data network up); for=D as for cut",
        random="optional",
        options=("for=D",),
    ),
    FaultKind(
        "drop-out",
        "node",
        "step",
        "break-link",
        "node N's packets to the supervisor vanish; the supervisor's still arrive (one direction "
        "dropped); for=D as for cut",
        random="optional",
        options=("for=D",),
    ),
    FaultKind(
        "flap",
        "node",
        "step",
        "break-link",
        "node N's link goes down and up every 0.2 s for D s (a flapping port)",
        random="optional",
        options=("for=D",),
    ),
    FaultKind(
        "isolate-supervisor",
        "job",
        "step",
        "break-link",
        "the supervisor's node loses every node of the run (its own link down); the nodes still reach "
        "each other. The ranks fence themselves and the run cannot go on: it requeues under Slurm, else "
        "stops in one line; no node is drained. for=D as for cut",
        random="never",
        options=("for=D",),
    ),
    FaultKind(
        "slow-link",
        "node",
        "step",
        "break-link",
        "node N's link, both ways, capped at M Mbit/s (tbf) from step S on (a degraded cable)",
        random="optional",
        options=("mbit=M",),
    ),
    FaultKind(
        "lossy",
        "node",
        "step",
        "break-link",
        "node N's link loses P% of its packets each way from step S on (a bad cable or optic); TCP "
        "retransmits",
        random="never",
        options=("percent=P",),
    ),
    FaultKind(
        "delay",
        "node",
        "step",
        "break-link",
        "node N's link holds each packet M ms each way from step S on (a long or congested path)",
        random="never",
        options=("ms=M",),
    ),
)
