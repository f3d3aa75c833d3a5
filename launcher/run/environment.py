"""The ``SRES_*`` environment variables that stand for ``sres`` options: one table, standard library only.

Every option of ``sres run`` and ``sres srun`` may also come from ``SRES_<OPTION>``
(``--preempt-signal`` -> ``SRES_PREEMPT_SIGNAL``): sbatch scripts export them, and
``srun --auto-resume`` (the SPANK plugin) passes no sres option at all. The parser
(``launcher.cli``: its defaults are :func:`defaults`), ``ResilientExecutor`` (:func:`values`, under
the parameters given) and the signal latch, which runs before torch is imported, all read them
through :data:`VARIABLES` and :func:`variable`, so none can read a different variable. Imported
before torch: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFIX = "SRES_"


def variable(option: str) -> str:
    """The environment variable of a long option: ``--preempt-signal`` -> ``SRES_PREEMPT_SIGNAL``."""
    return PREFIX + option.removeprefix("--").upper().replace("-", "_")


def option_value(option: str, argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """``option``'s value as the CLI will see it, before argparse runs: the last one in ``argv``
    (``--opt V`` or ``--opt=V``; nothing after ``--``, which starts the training command), else
    its variable in ``environ``, else None."""
    found = None
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == option and i + 1 < len(argv):
            found, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(option + "="):
            found = argv[i].split("=", 1)[1]
        i += 1
    return found if found is not None else environ.get(variable(option))


KINDS = ("value", "switch", "list")
"""How a variable's text is read: ``value`` as the option's own text (the parser converts it),
``switch`` true for 1/true/yes, ``list`` items separated by ``;`` (used only when the command line
gives none: an option given there replaces the list rather than adding to it)."""


@dataclass(frozen=True)
class Variable:
    """One ``SRES_*`` variable the ``sres`` process reads; ``option`` None: no option stands for it."""

    name: str
    option: str | None
    description: str
    kind: str = "value"

    @property
    def dest(self) -> str | None:
        """The option's name in Python (``--preempt-signal`` -> ``preempt_signal``): argparse's
        ``dest`` and the field of ``launcher.run.request.RunOptions``."""
        return self.option.removeprefix("--").replace("-", "_") if self.option else None

    def read(self, text: str) -> str | bool | list[str]:
        """The variable's text as its kind reads it."""
        if self.kind == "switch":
            return text.lower() in ("1", "true", "yes")
        if self.kind == "list":
            return [item for item in text.split(";") if item.strip()]
        return text


def _of(option: str, description: str, kind: str = "value") -> Variable:
    return Variable(variable(option), option, description, kind)


VARIABLES: tuple[Variable, ...] = (
    _of("--inject", "faults to inject, SPEC;SPEC (--inject on the command line replaces them)", "list"),
    _of("--log-dir", "where events.jsonl and rank logs go"),
    _of("--standby", "warm standby processes per node"),
    _of("--backend", "torch.distributed backend: gloo or nccl"),
    _of("--no-fork-server", "start every rank cold, without a fork server (1/true/yes)", "switch"),
    _of("--hang-timeout", "seconds without heartbeat before a rank is declared hung"),
    _of("--reform-timeout", "seconds to wait for every rank of a new generation"),
    _of("--replication-factor", "copies of each sharded state shard"),
    _of("--copy-pace", "share of the recent step time each buddy copy is spread over (0: at once)"),
    _of("--node-fault-after", "process faults on one node after which the node is drained and replaced"),
    _of("--max-requeues", "requeues of the whole job allowed ('none': Slurm's MaxBatchRequeue only)"),
    _of("--max-timeout-requeues", "requeues at the job's time limit allowed, counted apart"),
    _of("--preempt-signal", "signal that means 'save and requeue'; held from the process's first moment"),
    _of("--metrics-port", "serve live metrics on this port (0: a free one)"),
    _of("--metrics-addr", "address the metrics endpoint binds"),
    _of("--metrics-textfile", "also write the metrics to this file"),
    _of("--straggler-factor", "a rank this many times the median step time is slow"),
    _of("--straggler-steps", "...for this many steps in a row"),
    _of("--straggler-action", "what a straggler causes: none (report it) or replace"),
    _of("--no-grow", "never add nodes (1/true/yes)", "switch"),
    _of("--grow-by", "how the run gains a node: satellite or expansion"),
    _of("--all-satellites", "every node that holds ranks is a satellite (1/true/yes)", "switch"),
    _of("--lend-partition", "the partition satellites are submitted to"),
    _of("--repair-after", "local runs: a drained simulated node is healthy again after this many seconds"),
    _of("--persistent-dir", "persistent checkpoint tier (shared filesystem)"),
    _of("--persist-every", "write every K-th commit to the persistent tier"),
    _of("--job-id", "the id the RAM and persistent tiers are filed under"),
    _of("--ram-every", "RAM and neighbour tiers every N-th step"),
    _of("--tier-config", "YAML file of tier settings"),
    _of("--no-tiers", "no checkpoint tiers at all (1/true/yes)", "switch"),
    _of("--min-nodes", "the world never shrinks below this"),
    _of("--max-nodes", "the world never grows above this"),
    _of("--on-no-spare", "a node lost with no spare: shrink, wait, requeue or fail"),
    _of("--resize-step", "the world changes by multiples of K nodes"),
    _of("--resize-sizes", "the only node counts allowed, e.g. 2,4,8"),
    _of("--grow-snooze", "no growth within S s of a restart or resize"),
    _of("--resize-timeout", "how long 'wait' holds for a node"),
    _of("--drain-grace", "how long ranks may take to reach a step boundary for a resize"),
    _of("--batch-policy", "a world that does not divide the global batch: keep-closest or fail"),
    _of("--lr-scaling", "LR scale for a changed global batch"),
    _of("--elastic-config", "YAML file of the elastic settings"),
    Variable("SRES_SLURM_BACKEND", None, "Slurm client driver of the sres process: auto, cli or pyslurm"),
)
"""Every ``SRES_*`` variable ``sres run``/``sres srun`` reads, one line each (a unit test keeps the
options equal to the parser's); what ranks get from the supervisor is ``RankEnv``'s."""


def values(environ: Mapping[str, str]) -> dict[str, str | bool | list[str]]:
    """Option name (``dest``) -> value, for every option variable set in ``environ``, read by its kind."""
    return {v.dest: v.read(environ[v.name]) for v in VARIABLES if v.dest and v.name in environ}


def defaults(environ: Mapping[str, str]) -> dict[str, str | bool]:
    """:func:`values` that a parser takes as its defaults: all but lists, which the command line
    replaces (an appending option would add to a default list instead)."""
    lists = {v.dest for v in VARIABLES if v.kind == "list"}
    return {dest: value for dest, value in values(environ).items() if dest not in lists}  # type: ignore[misc]


def options() -> dict[str, bool]:
    """Every option in the table -> whether it reads the next argument as its value (not a switch):
    what ``sres srun`` needs to pick its own options out of srun's."""
    return {v.option: v.kind != "switch" for v in VARIABLES if v.option}
