"""The README's first command on a fresh machine: the wheel into a new venv, no extras, ``sres demo``.

The suite itself runs in an environment with the test extras, whose packages pull in others
(``transformers`` brings ``safetensors``): a dependency the product forgot to declare is there by
luck. This builds the wheel as ``pip install .`` does, installs it with ``torch==2.13.0`` (the CPU
build) and nothing else into a venv of its own, imports every module of the product there, and
runs ``sres demo`` as the README says, from an empty folder. An integration (``.lightning``,
``.hf``, ``.accelerate``, ``.torchtitan`` of ``resilience.integrations``) imports the user's
framework, which that venv lacks: its import must fail in one line naming its extra, and no other module's
may. The demo's run is also the demo's test (a second run of it cost CI 40 s): the fault run ends
bitwise like the reference, and both runs' goodput accounts add up (no negative part, the parts
sum to the wall time, no straggler time in runs without a slow node).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.goodput_checks import assert_account_adds_up

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ("pyproject.toml", "README.md", "launcher", "resilience", "slurm_plugins", "sbatch_templates")

IMPORT_ALL = """
import importlib, pkgutil, sys
import launcher, resilience, slurm_plugins
for package in (launcher, resilience, slurm_plugins):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as err:  # an integration without its framework: one line naming its extra
            extra = "pip install 'slurm-resilience["
            if not info.name.startswith("resilience.integrations.") or extra not in str(err):
                raise
            print("needs its extra:", info.name, "-", err)
ours = [m for m in sys.modules if m.partition(".")[0] in ("launcher", "resilience", "slurm_plugins")]
print("imported", len(ours))
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    )
    return done.stdout + done.stderr


@pytest.mark.timeout(900)
def test_the_readme_s_first_command_works_in_a_fresh_venv_without_extras_and_its_demo_adds_up(tmp_path: Path):
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in SOURCE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_", "PYTHON"))}
    env["SRES_RAM_ROOT"] = os.environ["SRES_RAM_ROOT"]  # this session's private RAM tier (conftest)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), "."],
        source,
        env,
        300,
    )
    [wheel] = (tmp_path / "dist").glob("slurm_resilience-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 120)
    _run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0", str(wheel)], tmp_path, env, 600)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    here = tmp_path / "user"
    here.mkdir()
    imported = _run([str(venv / "bin" / "python"), "-c", IMPORT_ALL], here, env, 300)
    *extras, count = imported.strip().splitlines()
    assert count.startswith("imported ") and int(count.split()[1]) > 100, imported
    # Each integration without its framework (none is installed here) says which extra to install.
    assert sorted(line.split()[3] for line in extras) == [
        "resilience.integrations.accelerate",
        "resilience.integrations.hf",
        "resilience.integrations.lightning",
        "resilience.integrations.torchtitan",
    ], imported
    out = _run(["sres", "demo"], here, env, 600)
    assert "bitwise identical on all 4 ranks: YES" in out, out[-3000:]
    (demo,) = (here / "sres-runs").glob("demo-*")
    reference = assert_account_adds_up(demo / "reference")
    with_fault = assert_account_adds_up(demo / "with-fault")
    assert reference["detection"] == 0 and with_fault["transfer"] > 0
    assert "other -" not in out, out  # the printed account has no negative part
