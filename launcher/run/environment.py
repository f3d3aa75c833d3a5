"""The ``SRES_*`` environment variables that stand for ``sres`` options: one table, standard library only.

Every option of ``sres run`` and ``sres srun`` may also come from ``SRES_<OPTION>``
(``--preempt-signal`` -> ``SRES_PREEMPT_SIGNAL``): sbatch scripts export them, and
``srun --auto-resume`` (the SPANK plugin) passes no sres option at all. The table is made from
the options' declarations (``launcher.run.options``), never listed again here. The parser
(``launcher.cli``: its defaults are :func:`defaults`), ``ResilientExecutor`` (:func:`values`, under
the parameters given) and the signal latch, which runs before torch is imported, all read them
through :data:`VARIABLES` and :func:`variable`, so none can read a different variable. Imported
before torch: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.run.option_spec import declared, flag, kind
from launcher.run.options import RunOptions

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
    rank: str | None = None
    """The ``RankEnv`` field that carries the option on to every rank; None: the supervisor's alone."""

    @property
    def dest(self) -> str | None:
        """The option's name in Python (``--preempt-signal`` -> ``preempt_signal``): argparse's
        ``dest`` and the field of ``launcher.run.options.RunOptions``."""
        return self.option.removeprefix("--").replace("-", "_") if self.option else None

    def read(self, text: str) -> str | bool | list[str]:
        """The variable's text as its kind reads it."""
        if self.kind == "switch":
            return text.lower() in ("1", "true", "yes")
        if self.kind == "list":
            return [item for item in text.split(";") if item.strip()]
        return text


def _declared() -> tuple[Variable, ...]:
    flags = ((flag(f.name), spec, kind(f.type)) for f, spec in declared(RunOptions))
    return tuple(Variable(variable(o), o, spec.doc, how, spec.rank) for o, spec, how in flags)


VARIABLES: tuple[Variable, ...] = (
    *_declared(),
    Variable("SRES_SLURM_DRIVER", None, "Slurm client driver of the sres process: auto, cli or pyslurm"),
    Variable("SRES_SLURM_BACKEND", None, "the old name of `SRES_SLURM_DRIVER`, read when that is unset"),
)
"""Every ``SRES_*`` variable ``sres run``/``sres srun`` reads: one per declared ``RunOptions`` field
(its flag, its doc line, read by its type's kind), then those no option stands for; what ranks
get from the supervisor is ``RankEnv``'s."""


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
