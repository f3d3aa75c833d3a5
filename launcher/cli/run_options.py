"""The options ``sres run`` and ``sres srun`` share, which say how a run is supervised, and their
reading into a ``RunOptions`` (``launcher.run.options``).

Each option is made from its declaration in ``RunOptions`` (flag, help, default, choices; the
command line lists none of them again), and each also reads ``SRES_<OPTION>`` through the one
table, ``launcher.run.environment`` (``srun --auto-resume`` passes no sres options; sbatch scripts
export these). What argparse needs beyond the declaration (the ``--inject`` action) is named there
and kept in :data:`CUSTOM`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

from launcher.cli.arg_types import finite_float
from launcher.run import environment
from launcher.run.option_spec import Option, choices_of, declared, flag, kind, shown_default
from launcher.run.options import RunOptions
from resilience.contract import injections


def count_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a count, or 'none'") from None


class _Inject(argparse.Action):
    """``--inject SPEC``, repeatable; ``--inject help`` (or ``-h``/``--help`` after it) lists
    every fault kind from its registry and exits."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values in HELP_WORDS:
            print(injections.kinds_help())  # to stdout, as --help
            parser.exit()
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


HELP_WORDS = ("help", "-h", "--help")


def inject_help_alias(argv: list[str]) -> list[str]:
    """``--inject --help`` as ``--inject help``: argparse would take ``--help`` for the command's
    own and say ``--inject`` expected an argument, where the user asked what it takes."""
    return [
        "help" if word in HELP_WORDS[1:] and i and argv[i - 1] == "--inject" else word
        for i, word in enumerate(argv)
    ]


def options_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RunOptions:
    """The parsed options as ``RunOptions``; faults to inject from ``SRES_INJECT`` when the command
    line gives none (a list the command line replaces, so argparse cannot take it as a default)."""
    values = {f.name: getattr(args, f.name) for f in fields(RunOptions)}
    values["inject"] = args.inject or environment.values(environ).get("inject", [])
    return RunOptions(**values)


def add_supervision_options(
    p: argparse.ArgumentParser, which: Callable[[Option], bool] | None = None
) -> None:
    """Every option of ``RunOptions`` (``which`` of them), made from its declaration, in the order
    ``--help`` shows them, with their ``SRES_*`` defaults."""
    groups: dict[str | None, Any] = {None: p}
    for f, spec in declared(RunOptions):
        if which is not None and not which(spec):
            continue
        if spec.group not in groups:
            groups[spec.group] = p.add_argument_group(spec.group)
        groups[spec.group].add_argument(flag(f.name), **_argument(f, spec))
    p.set_defaults(**environment.defaults(os.environ))  # text: argparse reads it as the option's type


CUSTOM: dict[str, dict[str, Any]] = {
    "inject": {"action": _Inject, "default": []},
    "count-or-none": {"type": count_or_none},
}
"""What a declaration's ``cli`` names: how argparse reads a value its annotation does not say."""

_TYPES: dict[str, Any] = {"int": int, "float": finite_float, "Path": Path}
"""A field's type -> argparse's ``type`` (a float must be finite: argparse's ``float`` takes nan)."""


def _argument(f: Field[Any], spec: Option) -> dict[str, Any]:
    """``add_argument``'s keywords for one declared option; the field's default is the parser's."""
    shown = shown_default(f, spec)
    shown = ", ".join(shown) if isinstance(shown, tuple) else shown
    help_ = spec.help.format(default=shown).replace("%", "%%")  # argparse expands % itself
    if kind(f.type) == "switch":
        return {"action": "store_true", "help": help_}
    keywords: dict[str, Any] = {"default": f.default, "help": help_}
    if spec.metavar:
        keywords["metavar"] = spec.metavar
    if spec.choices is not None:
        keywords["choices"] = choices_of(spec)
    base = str(f.type).removesuffix(" | None")
    if base in _TYPES:
        keywords["type"] = _TYPES[base]
    return keywords | (CUSTOM[spec.cli] if spec.cli else {})  # a misspelt name fails every parser build
