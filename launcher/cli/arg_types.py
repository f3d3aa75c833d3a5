"""Argument types shared by the subcommands: ``finite_float`` because argparse's ``float`` takes
``nan``, which compares false with every bound and so turns any bound check off."""

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
    if abs(value) > LARGEST:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond {LARGEST:.0e} (a typo?)")
    return value


LARGEST = 1e9
"""No flag of ours means more (seconds, days, rates): a larger one is a typo, and as a timeout
it overflows the clocks (``timestamp too large``) instead of failing in one line."""
