"""mypy, strict, over the typed part of the tree (``[tool.mypy]`` in pyproject.toml): the contract
between the supervisor and the ranks, the rank's agent, the supervisor, the placement protocols,
and the fake placement of ``test_supervisor_loop.py``; what they import is analysed, not reported.

Protocols are structural: nothing at run time says that a placement still has every capability
after a protocol changed. :func:`every_placement` says it to mypy, which checks it here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from launcher.placement import Placement
    from launcher.placement.local import LocalPlacement
    from launcher.placement.srun import SrunPlacement
    from tests.unit.test_supervisor_loop import FakePlacement

ROOT = Path(__file__).resolve().parents[2]
STRICT = (
    "resilience.contract.*",
    "launcher.supervisor.*",
    "launcher.placement.*",
    "resilience.agent.*",
    "tests.unit.test_supervisor_loop",
    "tests.unit.test_types",
)
"""The modules of pyproject.toml's override that must get every flag of ``--strict``."""

needs_mypy = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (it is in the test extra: pip install -e '.[test]')",
)


def every_placement(local: LocalPlacement, srun: SrunPlacement, fake: FakePlacement) -> list[Placement]:
    """Never called: mypy checks that each placement is a :class:`Placement` (all capabilities)."""
    return [local, srun, fake]


@needs_mypy
@pytest.mark.local  # spawns: mypy
def test_the_typed_modules_pass_mypy() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, f"mypy (pyproject.toml's [tool.mypy]) found:\n{done.stdout}{done.stderr}"


@needs_mypy
def test_the_typed_modules_get_every_flag_of_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``strict = true`` in an override section would turn strict on for every module (mypy
    applies it globally from any section), so pyproject.toml spells out its flags: still all of
    them, for this mypy's ``--strict``."""
    from mypy.main import process_options
    from mypy.options import PER_MODULE_OPTIONS

    monkeypatch.delenv("MYPY_CONFIG_FILE_DIR", raising=False)  # process_options sets it
    bare = tmp_path / "mypy.ini"
    bare.write_text("[mypy]\n")
    _, plain = process_options(["--config-file", str(bare), "-c", "pass"])
    _, strict = process_options(["--config-file", str(bare), "--strict", "-c", "pass"])
    flags = {
        name: getattr(strict, name)
        for name in dir(strict)
        if not name.startswith("_")
        and not callable(getattr(strict, name))
        and getattr(strict, name) != getattr(plain, name)
    }
    assert flags, "--strict set no flag"
    monkeypatch.chdir(ROOT)
    _, ours = process_options([])  # pyproject.toml's (its files are the targets)
    missing = []
    for name, value in sorted(flags.items()):
        if name not in PER_MODULE_OPTIONS:
            if getattr(ours, name) != value:
                missing.append(f"[tool.mypy]: {name} = {value}")
            continue
        for module in STRICT:
            if ours.per_module_options.get(module, {}).get(name) != value:
                missing.append(f"{module}: {name} = {value}")
    assert not missing, "pyproject.toml lacks flags of --strict:\n" + "\n".join(missing)
