"""A small file read only when it is this user's own: the run's secret, the control token.

Both live in a run's log dir, which root or a supervisor may read on a user's behalf. A link
planted there would hand them another file (root's), and a file of another user's would hand
them its writer's text: so the file is opened without following a link and read only when it
is a regular file of this user's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from resilience.errors import NotPrivate


def read_own(path: Path, limit: int) -> tuple[str, int]:
    """The first ``limit`` bytes of ``path`` as text, stripped, and the file's mode. Raises
    NotPrivate (a PermissionError) for a link or a file that is not this user's, OSError as
    ``open`` does otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise NotPrivate(f"{path} is not a file of this user's: not read")
        return f.read(limit).decode(errors="replace").strip(), st.st_mode
