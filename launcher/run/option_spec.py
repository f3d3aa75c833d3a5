"""How a run option is declared once, so that the parser, the environment table, the configs, the
ranks' environment and the reference pages are all made from one field of ``RunOptions``.

Before, one option was spelled by hand in up to eight places that unit tests kept equal. The
field's metadata carries what those places need: its flag and ``SRES_*`` variable (from its name),
its help and doc line, its choices, its ``--help`` group, the ``RunConfig`` field it fills and the
``RankEnv`` field that carries it to ranks.

Standard library only: the signal latch imports ``RunOptions`` before torch. What lives in a
module that imports more (a tuple of choices, a default that another config decides, an argparse
action) is named as ``"module:NAME"`` text and resolved only by whoever needs it.
"""

from __future__ import annotations

import importlib
from dataclasses import Field, dataclass, field, fields
from typing import Any

METADATA_KEY = "sres-option"


@dataclass(frozen=True)
class Option:
    """What a field of ``RunOptions`` is, beyond its name, type and default."""

    doc: str
    """One line: what its ``SRES_*`` variable means (``docs/reference/environment.md``)."""
    help: str
    """Its ``--help`` text; ``{default}`` is the default shown (``shown``'s, else the field's),
    formatted once when the parser is built, so a default taken from the environment as text
    cannot break ``--help``."""
    metavar: str | None = None
    choices: tuple[str, ...] | str | None = None
    """The allowed values, or ``"module:NAME"`` of them (their owner may import torch)."""
    cli: str | None = None
    """A named argparse action or type (``launcher.cli.run_options.CUSTOM``) for a value the
    annotation does not say how to read from the command line."""
    shown: str | None = None
    """``"module:Class.attr"``: the default ``{default}`` shows where the field's is None because
    another config (``ElasticConfig``) decides it."""
    group: str | None = None
    """The ``--help`` group's title; None: the command's own options."""
    config: str | None = None
    """The ``RunConfig`` field it is passed to unchanged, or ``elastic.<key>`` /
    ``straggler.<key>`` of that sub-config; None: ``launcher.run.configs`` reads it by hand."""
    rank: str | None = None
    """The ``RankEnv`` field that carries it to every rank; None: the supervisor's alone. Where
    it equals ``config``, the supervisor passes the value on without naming it."""


def option(default: Any, *, doc: str, help: str | None = None, **more: Any) -> Any:
    """A ``RunOptions`` field with its declaration; ``help`` defaults to ``doc``. Typed ``Any`` as
    ``dataclasses.field`` is, so that ``standby: int = option(0, ...)`` checks."""
    return field(default=default, metadata={METADATA_KEY: Option(doc, help or doc, **more)})


def declared(cls: type) -> list[tuple[Field[Any], Option]]:
    """Each declared field of ``cls``, in declaration order (``--help``'s and the tables')."""
    return [(f, f.metadata[METADATA_KEY]) for f in fields(cls) if METADATA_KEY in f.metadata]


def flag(name: str) -> str:
    """An option's flag from its Python name: ``hang_timeout`` -> ``--hang-timeout``."""
    return "--" + name.replace("_", "-")


def kind(annotation: object) -> str:
    """How its variable's text is read, from the field's type: a switch, a list or a value."""
    base = str(annotation).removesuffix(" | None")
    return {"bool": "switch", "tuple[str, ...]": "list"}.get(base, "value")


def resolve(reference: str) -> Any:
    """``"module:Name.attr"``'s value, importing the module now."""
    module, _, path = reference.partition(":")
    value: Any = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value


def choices_of(spec: Option) -> tuple[str, ...] | None:
    """The option's allowed values, its owner's module imported if they are named by reference."""
    return resolve(spec.choices) if isinstance(spec.choices, str) else spec.choices


def shown_default(f: Field[Any], spec: Option) -> Any:
    """What ``{default}`` in its help stands for."""
    return resolve(spec.shown) if spec.shown else f.default
