"""What a rank's agent gives its ``BatchCache`` at ``ctx.register``: :class:`BatchLink`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BatchLink:
    """The node's cache directory and the job it belongs to, whether a producer serves it
    (``resilience.run(train, batches=...)``), and the run's event channel."""

    root: Path
    job: str
    producer: bool
    push_event: Callable[..., None]
