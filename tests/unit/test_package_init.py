"""``import resilience`` is cheap and its names load on first use (PEP 562): the admins' hooks
and the contract import parts of the package without torch, users keep ``resilience.run``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.local  # each test imports in a fresh interpreter (a subprocess)

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_its_errors_and_the_tier_layout_imports_no_torch():
    out = _python("""
        import sys
        import resilience, resilience.errors, resilience.tiers
        from resilience import GradientNotRepresentable, Unrecoverable
        print("torch" in sys.modules, resilience.Unrecoverable is Unrecoverable)
    """)
    assert out == "False True"


def test_every_public_name_loads_on_first_use_and_ddp_stays_the_function():
    out = _python("""
        import resilience.ddp  # the module, first: the agent imports it before train runs
        import resilience
        from resilience import *
        names = [resilience.run, resilience.Context, ElasticSampler, ExactDataParallel, PerRank]
        missing = [n for n in resilience.__all__ if n not in dir(resilience)]
        print(callable(resilience.ddp) and resilience.ddp.__name__ == "ddp", len(names), missing)
    """)
    assert out == "True 5 []"


def test_an_unknown_name_is_an_attribute_error():
    out = _python("""
        import resilience
        try:
            resilience.no_such_name
        except AttributeError as err:
            print(err)
    """)
    assert out == "module 'resilience' has no attribute 'no_such_name'"


def test_a_function_of_a_script_that_uses_the_package_pickles_and_runs_elsewhere(tmp_path):
    """submitit pickles a function defined in a script's ``__main__`` by value, and the modules
    it names by reference: ``resilience`` (a module subclass, for ``resilience.ddp``) must pickle
    as a plain module does, or ``ex.submit(train)`` fails in the user's script."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
            import pickle, sys
            import cloudpickle
            import resilience

            def train():
                return resilience.Unrecoverable.__name__, type(resilience).__name__

            blob = cloudpickle.dumps(train)
            assert pickle.loads(pickle.dumps(resilience)) is resilience
            sys.stdout.buffer.write(blob)
        """)
    )
    blob = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, timeout=120, check=True
    ).stdout
    out = _python(f"""
        import pickle
        print(pickle.loads({blob!r})())
    """)
    assert out == "('Unrecoverable', '_Package')"
