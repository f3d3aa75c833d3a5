"""What ranks tell each other before a recovery crosses gloo, whose connections are not
authenticated: a pickle there would run in the rank. Attacked by a process of another uid that
joins the gather as the other rank (standing in for one that took over a gloo connection) and
sends a pickle that creates a file with the victim's rights."""

from __future__ import annotations

import sys

import pytest

from tests.support.users import User


def gather(victim: User, attacker: User, mode: str) -> tuple[str, bool]:
    """The victim's output and whether the attacker's payload ran in it."""
    marker = victim.home / f"ran-{mode}"
    marker.unlink(missing_ok=True)
    module = [sys.executable, "-m", "tests.support.gather_peer"]
    first = victim.popen([*module, "victim", mode])
    try:
        assert first.stdout is not None
        port = first.stdout.readline().strip()
        assert port.isdigit(), first.stderr.read() if first.stderr else ""
        second = attacker.run([*module, "attacker", port, str(marker)], timeout=60)
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0, err[-2000:]
    assert second.returncode == 0, second.stderr[-2000:]
    return out, marker.exists()


@pytest.mark.timeout(120)
def test_a_peer_s_pickle_in_the_holdings_gather_is_refused_and_never_runs(users):
    victim, attacker = users
    # The control: torch's all_gather_object unpickles the attacker's bytes in the victim.
    out, ran = gather(victim, attacker, "object")
    assert ran, f"the attack should work on all_gather_object: {out}"
    # sres's gather of holdings: the same bytes are refused in one line, and run nothing.
    out, ran = gather(victim, attacker, "json")
    assert not ran
    assert "refused: holdings from rank 1 is not JSON" in out
