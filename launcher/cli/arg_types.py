"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    """A number that is not nan or inf: argparse's ``float`` takes both, and a nan compares
    false with every bound, so a nan timeout or rate turns its check off without a word (or a
    loop over it never ends)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value
