"""The start-up check of the nameserver (launcher/supervisor/name_lookup.py): which address is
asked, and when a slow answer becomes a warning. The real slow nameserver is
tests/network/test_slow_nameserver.py's."""

from __future__ import annotations

import pytest

from launcher.supervisor import name_lookup
from launcher.supervisor.name_lookup import Lookup


@pytest.mark.parametrize(
    ("host", "asked"),
    [
        ("127.0.0.1", "::ffff:127.0.0.1"),
        ("10.0.0.5", "::ffff:10.0.0.5"),
        ("::1", "::1"),
    ],
)
def test_the_address_asked_is_the_one_torchs_client_connects_to(host, asked):
    assert name_lookup.client_form(host) == asked


def test_a_fast_answer_says_nothing_and_a_slow_one_says_what_to_do():
    fast = Lookup("::ffff:10.0.0.5", 0.002, "::ffff:10.0.0.5")
    slow = Lookup("::ffff:10.0.0.5", 5.01, "gaierror: [Errno -3] Temporary failure in name resolution")
    assert name_lookup.warning(fast, "10.0.0.5") is None
    line = name_lookup.warning(slow, "10.0.0.5")
    assert line is not None and line.startswith("warning: a reverse name lookup of ::ffff:10.0.0.5")
    assert "took 5.0 s" in line and "/etc/hosts" in line and "'::ffff:10.0.0.5 <name>'" in line
    assert name_lookup.warning(slow, "10.0.0.5", slow_s=6.0) is None


def test_the_watch_says_at_most_one_line_and_never_raises():
    said: list[str] = []
    name_lookup.watch("127.0.0.1", said.append, slow_s=0.0).join(30)
    assert len(said) == 1 and "::ffff:127.0.0.1" in said[0]
    said.clear()
    name_lookup.watch("no-such-host.invalid", said.append).join(30)
    assert len(said) == 1 and said[0].startswith("warning: could not resolve the store's address")
