"""The health config: defaults, and one clear line naming the key for every kind of mistake."""

from __future__ import annotations

import pytest

from slurm_plugins import health_config
from slurm_plugins.health_config import HealthConfig, HealthConfigError, config_path, parse


def error(data) -> HealthConfigError:
    with pytest.raises(HealthConfigError) as info:
        parse(data, "h.yaml")
    return info.value


def test_empty_config_is_the_defaults_and_round_trips():
    assert parse({}) == HealthConfig()
    assert parse(health_config.to_dict(HealthConfig())) == HealthConfig()
    assert HealthConfig().on_config_error == "open"


def test_nested_values_and_lists_are_built():
    cfg = parse(
        {
            "on_config_error": "closed",
            "actions": {"transient": "reboot"},
            "checks": {
                "disk": [{"path": "/scratch", "min_free_mib": 5}],
                "mounts": [{"path": "/home"}],
                "commands": [{"name": "ib", "command": ["ibstat", "-s"], "fault": "transient"}],
                "gpu": {"expected_count": 8, "xid_fail": [79]},
            },
        }
    )
    assert cfg.on_config_error == "closed" and cfg.actions.transient == "reboot"
    assert cfg.checks.disk[0].path == "/scratch" and cfg.checks.mounts[0].writable is True
    assert cfg.checks.commands[0].command == ("ibstat", "-s") and cfg.checks.gpu.xid_fail == (79,)


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({"checks": {"memory": {"min_free_gb": 1}}}, "checks.memory.min_free_gb", "unknown key"),
        ({"chekcs": {}}, "chekcs", "unknown key"),
        (
            {"checks": {"memory": {"min_free_mib": "lots"}}},
            "checks.memory.min_free_mib",
            "expected an integer",
        ),
        ({"checks": {"memory": {"min_free_mib": True}}}, "checks.memory.min_free_mib", "expected an integer"),
        ({"checks": {"memory": {"min_free_mib": -1}}}, "checks.memory.min_free_mib", "must not be negative"),
        ({"budget": {"per_check_s": -5}}, "budget.per_check_s", "must not be negative"),
        ({"budget": {"per_check_s": 0}}, "budget", "must be positive"),
        (
            {"checks": {"gpu": {"max_temperature_c": -3.5}}},
            "checks.gpu.max_temperature_c",
            "must not be negative",
        ),
        ({"on_config_error": "maybe"}, "on_config_error", "must be one of open, closed"),
        ({"actions": {"persistent": "explode"}}, "actions.persistent", "must be one of drain, reboot"),
        ({"checks": {"disk": {"path": "/tmp"}}}, "checks.disk", "expected a list"),
        ({"checks": {"disk": [{"min_free_mib": 3}]}}, "checks.disk[0].path", "missing"),
        (
            {"checks": {"gpu": {"fail_throttle_reasons": ["too_hot"]}}},
            "checks.gpu",
            "unknown reason 'too_hot'",
        ),
        ({"checks": {"shm": {"enabled": "yes"}}}, "checks.shm.enabled", "expected true or false"),
        (["not", "a", "mapping"], "(top level)", "expected a mapping"),
    ],
)
def test_mistakes_name_the_key_in_one_line(data, key, words):
    err = error(data)
    assert err.key == key and words in str(err)
    assert str(err).startswith(f"health config h.yaml: {key}: ") and "\n" not in str(err)


def test_files_yaml_errors_and_where_the_config_comes_from(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("checks:\n  memory: [unclosed\n")
    with pytest.raises(HealthConfigError, match="not valid YAML at line"):
        health_config.load(bad)
    with pytest.raises(HealthConfigError, match="no such file"):
        health_config.load(tmp_path / "missing.yaml")
    assert health_config.load(tmp_path / "missing.yaml", required=False) == HealthConfig()
    assert config_path("/a.yaml", {"SRES_HEALTH_CONFIG": "/b.yaml"}) == (health_config.Path("/a.yaml"), True)
    assert config_path(None, {"SRES_HEALTH_CONFIG": "/b.yaml"}) == (health_config.Path("/b.yaml"), True)
    assert config_path(None, {}) == (health_config.DEFAULT_PATH, False)


def test_failure_policy_of_a_config_that_did_not_validate():
    assert health_config.failure_policy({"on_config_error": "closed", "typo": 1}) == "closed"
    assert health_config.failure_policy({"on_config_error": "sideways"}) == "open"
    assert health_config.failure_policy("garbage") == "open"
