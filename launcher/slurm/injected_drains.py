"""Real nodes drained for an injected fault are resumed when the run ends.

``--inject node:...`` under Slurm loses a node the way a real loss does: its ranks die and it is
drained (``sres: node lost (injected fault)``), so the run replaces it. But the node itself was
healthy, and the drain outlived the run: a user's test took a node from everyone until an admin
resumed it. At the run's end such a node is resumed when it still carries that very reason and
its slurmd answers; a drain with any other reason (an admin's, a health check's, a real loss
found later) is left alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from launcher.errors import SlurmError
from launcher.slurm.client import SlurmClient

MARK = "(injected fault)"
"""How the policy's reason for an injected loss ends (``policy.classify.INJECTED_NODE_LOSS``)."""


def _say(text: str) -> None:
    print(f"sres: {text}", file=sys.stderr, flush=True)


class InjectedDrains:
    """The real nodes this run drained for injected faults, to resume at its end."""

    def __init__(self, client: SlurmClient, say: Callable[[str], None] = _say) -> None:
        self.client, self.say = client, say
        self.nodes: set[str] = set()

    def note(self, name: str, why: str) -> None:
        if why.endswith(MARK):
            self.nodes.add(name)

    def undo(self) -> list[str]:
        """Resume those still drained for the injection and responding; say which, in one line."""
        if not self.nodes:
            return []
        try:
            found = self.client.nodes(names=sorted(self.nodes))
            ours = [n.name for n in found if n.drained_by_us and n.reason.endswith(MARK) and n.responding]
            resumed = self.client.resume(ours) if ours else []
        except SlurmError as err:
            names = ", ".join(sorted(self.nodes))
            self.say(f"warning: {names}, drained for injected faults, not resumed: {err}")
            return []
        if resumed:
            names = ", ".join(resumed)
            self.say(f"resumed {names}: drained only for an injected fault (a real loss stays drained)")
        self.nodes.clear()
        return resumed
