"""The command line that runs one of sres's own modules in a new Python process.

``python -m pkg`` puts the working directory first on ``sys.path``: started in a directory
another user can write (a project's shared space, or ``/tmp``, where ``srun`` lands when the
caller's directory is missing on the node), a planted ``launcher/__init__.py`` there ran as the
user, and in a root hook as root. ``-P`` (Python 3.11+) leaves the working directory off the
path while the user's own ``PYTHONPATH`` (a source checkout, a venv) still counts; ``-I`` would
drop that too. Where sres also picks the working directory (a job step), it picks ``/``, which
no one else can write, and that alone closes it on 3.10.

The user's own code (a rank, a submitit function) keeps the user's directory and path: its
imports are theirs to resolve.

Standard library only: the admins' hooks use it too.
"""

from __future__ import annotations

import sys

SAFE_PATH: tuple[str, ...] = ("-P",) if sys.version_info >= (3, 11) else ()


def own_module(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """``python -P -m module args...``: ``module`` from where this interpreter finds sres."""
    return [python, *SAFE_PATH, "-m", module, *args]
