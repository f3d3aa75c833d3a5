"""What a node's fork server and the supervisor say to each other, over the server's stdin and stdout.

The channel is the server process's own pipes (under ``srun``, the step's I/O, which Slurm
forwards over its authenticated connection), so a request may carry a rank's whole environment,
the run's secret included: nothing is written where another user could read it.

- Requests, one JSON object per line on the server's stdin: ``{"fork": slot, "env": {...}}``
  (start that slot's process with that environment) and ``{"kill": slot}``. End of input: the
  server forks nothing more and exits once its children have.
- Replies, on the server's stdout, each line starting with :data:`MARK` then one JSON object:
  ``{"ready": seconds}`` (warm: it imported the script and paid first-use costs),
  ``{"forked": slot, "pid": pid}``, ``{"refused": slot, "why": text}``,
  ``{"exit": slot, "code": code}`` (negative: killed by that signal, as ``Popen.returncode``),
  ``{"out": slot, "line": text}`` (a line a child printed). A line without the mark is the
  server's own output (what the script printed while it was imported).
"""

from __future__ import annotations

import json
from typing import Any

MARK = b"\x1esres-fork "
"""Starts every reply line: a record separator no training log begins a line with."""


def encode(message: dict[str, Any]) -> bytes:
    """One request or reply line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def reply(message: dict[str, Any]) -> bytes:
    return MARK + encode(message)


def decode_reply(line: bytes) -> dict[str, Any] | None:
    """A reply line's message; None for a line without the mark (the server's own output) or one
    that does not decode (a truncated line of a killed server)."""
    if not line.startswith(MARK):
        return None
    try:
        message = json.loads(line[len(MARK) :])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
