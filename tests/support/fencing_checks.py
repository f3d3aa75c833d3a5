"""What a user reads to see that a cut-off node's ranks wrote nothing once they were replaced:
every tier copy's manifest names the generation that wrote it, and events say when a newer
generation replaced a node."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from resilience.tiers.layout import job_ram_dir


def stale_copies(of: Callable[[str], list[dict]], job_id: str) -> list[str]:
    """Tier copies of job ``job_id`` written by a generation after a newer one replaced a node of
    it; ``of(kind)``: the run's events of that kind (``Run.of``, ``TrainingJob.of``)."""
    replaced = {e["generation"]: e["t"] for e in of("generation") if e["replaced"]}
    stale = []
    # This job's copies only: the session's RAM root also holds the jobs of the tests that ran
    # before in the same lane, some with manifests broken on purpose.
    for manifest in job_ram_dir(job_id, Path(os.environ["SRES_RAM_ROOT"])).rglob("manifest.json"):
        data = json.loads(manifest.read_text())
        newer = [t for g, t in replaced.items() if g > data.get("generation", 0)]
        if data["job_id"] == job_id and newer and data["created"] > min(newer):
            stale.append(f"{manifest}: generation {data.get('generation')}")
    return stale
