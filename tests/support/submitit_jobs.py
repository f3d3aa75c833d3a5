"""Functions the submitit tests submit: importable by the job's own process, which unpickles
them by module and name."""

from __future__ import annotations


def always_raises(ctx, message: str) -> None:
    raise ValueError(message)
