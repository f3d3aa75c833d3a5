"""One exception hierarchy per package, in its errors.py, found by walking every module.

A new error class anywhere but in its package's errors.py, or not under the package's base,
fails here without anyone having to list it. Names users import from the old places still work.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from launcher.errors import SresError
from resilience.errors import ResilienceError
from slurm_plugins.errors import HooksError

BASES = {"resilience": ResilienceError, "launcher": SresError, "slurm_plugins": HooksError}
NOT_ERRORS = {
    "resilience.agent.commits.Paused": "control flow: a rank leaving a generation at a step boundary",
    "launcher.supervisor.loop.DecisionLoopError": "our bug (a policy that never settles), with its traceback",
}


def _exception_classes(package: str) -> dict[str, type]:
    """Every exception class defined at the top of a module of ``package`` (name -> class)."""
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")]
    found = {}
    for name in names:
        if name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as err:  # an integration whose framework lives in an environment of its own
            if name.startswith("resilience.integrations.") and "pip install 'slurm-resilience[" in str(err):
                continue
            raise
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_lives_in_its_packages_errors_module_under_its_base(package):
    found = {name: cls for name, cls in _exception_classes(package).items() if name not in NOT_ERRORS}
    assert found, "the walk found nothing"
    elsewhere = sorted(name for name, cls in found.items() if cls.__module__ != f"{package}.errors")
    assert elsewhere == []
    assert sorted(name for name, cls in found.items() if not issubclass(cls, BASES[package])) == []


def test_the_exceptions_to_the_rule_still_exist():
    for name in NOT_ERRORS:
        module, _, cls = name.rpartition(".")
        assert hasattr(importlib.import_module(module), cls), f"{name} is gone: drop it from NOT_ERRORS"


def test_the_names_users_import_still_work():
    import resilience
    from resilience.contract.elastic_config import ElasticConfigError
    from resilience.contract.injections import InjectSpecError
    from resilience.contract.tier_config import TierConfigError
    from resilience.elastic import BatchError
    from resilience.exact import GradientNotRepresentable
    from resilience.state.replication import Unrecoverable
    from resilience.tiers import TierConfigError as TierConfigError2
    from resilience.tiers.manifest import CheckpointError, CheckpointInvalid, OtherJob
    from launcher.slurm.hostlist import HostlistError
    from launcher.supervisor.control import ControlError, Unreachable
    from slurm_plugins.health_config import HealthConfigError

    assert resilience.Unrecoverable is Unrecoverable
    assert resilience.GradientNotRepresentable is GradientNotRepresentable
    assert TierConfigError is TierConfigError2
    assert issubclass(OtherJob, CheckpointInvalid) and issubclass(CheckpointInvalid, CheckpointError)
    assert all(
        issubclass(e, ValueError) for e in (ElasticConfigError, InjectSpecError, TierConfigError, BatchError)
    )
    assert issubclass(HostlistError, ValueError) and issubclass(Unreachable, ControlError)
    assert issubclass(HealthConfigError, SresError)
