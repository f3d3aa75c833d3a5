"""A rank's warnings say they are sres's and whose, unless the user configured logging."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.local  # a fresh process each: logging is set up once per process

WARN = "import logging; from resilience import rank_log; {setup}rank_log.say_who('n1p0'); "
WARN += "logging.getLogger('resilience.tiers').warning('neighbour copy refused: header cut off')"


def _stderr(setup: str = "") -> str:
    code = WARN.format(setup=setup)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr


def test_a_warning_says_sres_and_the_slot():
    assert _stderr().splitlines() == ["sres: n1p0: neighbour copy refused: header cut off"]


def test_a_user_who_configured_logging_keeps_their_format():
    out = _stderr("logging.basicConfig(format='USER %(name)s %(message)s'); ")
    assert out.splitlines() == ["USER resilience.tiers neighbour copy refused: header cut off"]
