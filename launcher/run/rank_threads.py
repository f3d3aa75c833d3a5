"""How many CPU threads each rank's torch and OpenMP use when the user did not say.

PyTorch sizes its intra-op pool by the machine's cores in every process, so N ranks sharing a
machine run N x cores threads on its cores: four ranks of a GPT-2 loop on two cores spent 28.6 s
of productive time against 3.8 s with one thread each. torchrun sets ``OMP_NUM_THREADS=1`` for
every process when a machine runs several and the variable is unset, and says so; users who
come from torchrun expect the same, and those who tune it set the variable themselves.
"""

from __future__ import annotations

from collections.abc import Mapping

VARIABLE = "OMP_NUM_THREADS"


def default_threads(environ: Mapping[str, str], ranks_per_machine: int) -> int | None:
    """The threads each rank gets where the user set none: 1 when a machine runs several rank
    processes, else None (one rank has the machine's cores to itself: torch's own default)."""
    if environ.get(VARIABLE, "").strip() or ranks_per_machine <= 1:
        return None
    return 1


def ranks_per_machine(placement: str, nodes: int, procs_per_node: int, spares: int) -> int:
    """Rank processes that share one machine's cores: every simulated node's under the local
    placement (they all run here), one node's under srun."""
    return procs_per_node if placement == "srun" else (nodes + spares) * procs_per_node


def note(threads: int, ranks: int) -> str:
    """The one line the run prints when it chose for the user, as torchrun does."""
    return (
        f"{VARIABLE}={threads} for each rank ({ranks} rank processes share a machine's cores; "
        f"set {VARIABLE} to choose another number)"
    )
