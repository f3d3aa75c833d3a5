"""What each rank of a node will read next, told to the node's batch producer through a file.

Each rank rewrites ``wants/rank-<R>.json`` in the cache directory as it takes a step: the step
it is at, how many steps behind it to keep (a rank re-entering at a recent commit reads them
again), and the entries of the next steps (step, key, what the batch is made of). The file is
JSON, written whole and renamed, in the user's private directory: data, never code. A file
not rewritten for :data:`FRESH_S` is a rank that left the node or stalls: it neither asks for
batches nor holds old ones back.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilience.private_paths import private_dir

FRESH_S = 30.0


@dataclass(frozen=True)
class Want:
    step: int
    key: str
    args: Any


@dataclass(frozen=True)
class RankWants:
    rank: int
    step: int
    """The step the rank is at: what it reads now."""
    lookback: int
    wants: tuple[Want, ...]


def folder(root: Path) -> Path:
    """The wants' directory in the cache ``root``, made private once (not at every step)."""
    return private_dir(root / "wants")


def write(where: Path, wants: RankWants) -> None:
    """``where``: the wants' directory, from :func:`folder`."""
    record = {
        "rank": wants.rank,
        "step": wants.step,
        "lookback": wants.lookback,
        "wants": [[w.step, w.key, w.args] for w in wants.wants],
    }
    path = where / f"rank-{wants.rank}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")))
    os.rename(tmp, path)


def read(root: Path, now: float | None = None) -> list[RankWants]:
    """The fresh wants of the node's ranks; a file that does not parse is skipped (being replaced)."""
    now = time.time() if now is None else now
    out = []
    folder = root / "wants"
    for path in sorted(folder.glob("rank-*.json")) if folder.is_dir() else ():
        try:
            if now - path.stat().st_mtime > FRESH_S:
                continue
            r = json.loads(path.read_text())
            entries = tuple(Want(int(s), str(k), a) for s, k, a in r["wants"])
            out.append(RankWants(int(r["rank"]), int(r["step"]), int(r["lookback"]), entries))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
