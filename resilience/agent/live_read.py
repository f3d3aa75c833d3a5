"""A background copy's reading of the live objects, which a generation's end closes.

A commit's snapshot is taken on a thread while the next step runs. When a fault ends the
generation under it, the rank does not wait for that thread (it may be stuck behind a copy to a
dead peer) but leaves it behind. A survivor then resumes from its live objects: the next
generation's model takes their tensors as its own (``register``) and trains on them in place. A
thread left behind that still read them would copy half-updated tensors into a tier under the
old step's name, with a checksum that matches. So the reading is bracketed: the generation's
end waits for a read under way (a memory copy: it ends) and forbids any later one, while the
rest of the copy (writing a tier, waiting for a lane) may stay behind.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from resilience.errors import ReadClosed, ResilienceError


TIMEOUT_S = 10.0
"""How long a generation's end waits for a read under way (a memory copy; the tests'
``stall-capture`` holds one 2 s) before the rank gives up its state and exits, a fault of its own."""


class LiveRead:
    """One background copy's permission to read the live objects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Where the copy reads live tensors; raises :class:`ReadClosed` once :meth:`close` ran."""
        with self._lock:
            if self._closed:
                raise ReadClosed("the generation ended before this copy read the live state")
            yield

    def close(self, timeout_s: float = TIMEOUT_S) -> None:
        """No read runs once this returns. A read still under way after ``timeout_s`` (a copy
        stuck inside one) raises: the live objects cannot be trusted, and this rank exits."""
        if not self._lock.acquire(timeout=timeout_s):
            raise ResilienceError(
                f"a background copy of the last commit still reads the live state {timeout_s:g} s "
                f"after the generation ended: this rank cannot resume from it"
            )
        self._closed = True
        self._lock.release()
