"""The GPU suite: skipped, with the reason, where no CUDA device exists; where one does, each
test also writes its figures to ``$SRES_GPU_OUT/figures.jsonl`` (one JSON object a line: test,
name, value, unit), which ``tests/gpu/run.sh`` brings back from a lent machine.

Runs alone too (``--confcutdir tests/gpu``, as run.sh does): it needs nothing of the suite's
root conftest (no Slurm cluster, no lanes), only a private RAM root for the runs it starts.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

SKIP_REASON = "no CUDA device here: the GPU suite runs on a machine with one (tests/gpu/run.sh)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (tests/gpu/); skipped with the reason elsewhere"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where figures go: ``$SRES_GPU_OUT`` (run.sh sets it to the device's $OUT), else a temp dir."""
    named = os.environ.get("SRES_GPU_OUT")
    path = Path(named) if named else tmp_path_factory.getbasetemp() / "gpu-out"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def figures(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., None]:
    """``figures(name, value, unit)``: one measured figure of this test, kept as a line of
    ``figures.jsonl`` (printed too, so that a log alone has them)."""
    path = out_dir(tmp_path_factory) / "figures.jsonl"

    def record(name: str, value: float | int | str | None, unit: str = "") -> None:
        line = {"test": request.node.name, "name": name, "value": value, "unit": unit}
        print(f"figure: {json.dumps(line)}", flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")

    return record


@pytest.fixture
def gpu_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder whose files come back from a lent machine (fixtures recorded there, logs)."""
    return out_dir(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def gpu_ram_root() -> Iterator[None]:
    """Runs started here keep their RAM tier in a private /dev/shm folder, removed at the end
    (the root conftest does the same for the whole suite; this one serves run.sh's lone run)."""
    if os.environ.get("SRES_RAM_ROOT"):
        yield
        return
    root = Path("/dev/shm") / f"sres-gpu-tests-{uuid.uuid4().hex[:8]}"
    os.environ["SRES_RAM_ROOT"] = str(root)
    try:
        yield
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.environ.pop("SRES_RAM_ROOT", None)
