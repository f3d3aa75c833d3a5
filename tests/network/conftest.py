"""The network tests' fixture: nodes in namespaces of their own (``tests/support/netns.py``)."""

from tests.support.netns import network  # noqa: F401 - a fixture, found by pytest here
