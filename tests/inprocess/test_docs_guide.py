"""The README's and the user guide's runnable code blocks, run as a reader would: saved as
scripts in a fresh folder, started with ``python`` or ``sres``, in order.

A block is runnable when its fence says so: ```` ```python file=train.py ```` is written to that
file, ```` ```bash run ```` is run with ``bash -euo pipefail`` (``sres`` from this environment on
PATH). Every other block is an excerpt and is left alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    file: str | None  # write the text to this file
    run: bool  # run the text with bash
    text: str


def runnable_blocks(markdown: str) -> list[Block]:
    blocks = []
    for language, info, text in FENCE.findall(markdown):
        words = info.split()
        file = next((w.removeprefix("file=") for w in words if w.startswith("file=")), None)
        run = language == "bash" and "run" in words
        if file or run:
            blocks.append(Block(file, run, text))
    return blocks


PAGES = [ROOT / "README.md", *sorted(p for p in GUIDE.glob("*.md") if runnable_blocks(p.read_text()))]


def test_the_readme_and_the_guide_have_runnable_blocks():
    assert {p.name for p in PAGES} >= {"README.md", "training-loops.md", "slurm.md", "submitit.md"}
    readme = runnable_blocks((ROOT / "README.md").read_text())
    assert [b.file for b in readme if b.file] == ["train.py", "submit.py"]  # both of its examples
    assert runnable_blocks("```python file=a.py\nx = 1\n```\n```bash\nls\n```\n```bash run\nls\n```\n") == [
        Block("a.py", False, "x = 1\n"),
        Block(None, True, "ls\n"),
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_runnable_blocks_of_the_guide_run(page: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for block in runnable_blocks(page.read_text()):
        if block.file:
            (tmp_path / block.file).write_text(block.text)
        if block.run:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.text],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (
                f"{page.name}: a block failed:\n{block.text}\n{done.stdout}{done.stderr}"
            )
            outputs.append(done.stdout + done.stderr)
    finals = re.findall(r"^final state (\S+)$", "".join(outputs), re.M)
    assert len(set(finals)) <= 1, f"{page.name}: runs the page says agree did not: {finals}"
    if page.name == "training-loops.md":
        assert len(finals) == 2 and "1 fault(s)" in outputs[-1], outputs
