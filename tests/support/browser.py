"""A page rendered by a real headless browser (Debian's chromium), as a reader's would: the
screenshot must exist, the console must be free of errors, and the picture must not be blank."""

from __future__ import annotations

import subprocess
from pathlib import Path

from PIL import Image


def assert_renders(page: Path, shot: Path, height: int = 2400) -> None:
    done = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            f"--window-size=1100,{height}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), done.stderr
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "ERR_" in line]
    assert not console, console
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # text, plots and colour bars: not a blank page
