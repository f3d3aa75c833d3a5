"""A Python with torchtitan, for the zoo's torchtitan case: an environment of its own beside the
suite's, because torchtitan 0.3.0 pins ``datasets<4.8``, whose ``huggingface-hub<2``
transformers 5 (the suite's) refuses. It sees the suite's packages (torch, sres's dependencies)
and adds torchtitan's; made once per machine, from the package registry, then reused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REQUIREMENTS = ("torchtitan==0.3.0", "triton")
"""The ``torchtitan`` extra of pyproject.toml at the version the zoo was written for (torchdata,
datasets and tokenizers, which the extra also names, come with torchtitan)."""


def titan_python() -> str:
    """The interpreter of the environment (made now if missing, which takes a minute)."""
    home = Path(os.environ.get("SRES_TORCHTITAN_ENV", Path.home() / ".cache" / "sres" / "torchtitan-0.3.0"))
    python = home / "bin" / "python"
    done = home / "installed"
    if done.exists() and done.read_text() == " ".join(REQUIREMENTS):
        return str(python)
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(home)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS],
        check=True,
        timeout=1200,
        stdout=subprocess.DEVNULL,
    )
    done.write_text(" ".join(REQUIREMENTS))
    return str(python)
