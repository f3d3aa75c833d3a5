"""What a rank's own warnings look like: one line that says it is sres and which slot wrote it.

The project logs under the ``resilience`` logger and never configured it, so Python's last-resort
handler printed a warning bare (``neighbour copy refused: header too long or cut off`` in a
healthy lending run: nothing said whose it was or whether it mattered). A user who configured
logging (a handler on the root or on ``resilience``) keeps their own format.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "resilience"


def say_who(slot: str) -> None:
    """Prefix this process's warnings with ``sres: <slot>:`` unless the user set up logging."""
    log = logging.getLogger(LOGGER)
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"sres: {slot}: %(message)s"))
    handler.setLevel(logging.WARNING)
    log.addHandler(handler)
