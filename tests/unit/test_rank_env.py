"""The supervisor -> rank contract: one dataclass, one spelling of the variables, checked options."""

from __future__ import annotations


import pytest

import resilience
from resilience.contract import injections
from resilience.contract.rank_env import RankEnv, node_name_environ
from resilience.errors import OptionError, RankEnvError
from resilience.tiers import TierConfig


def full() -> RankEnv:
    return RankEnv(
        store_host="10.0.0.1",
        store_port=29500,
        slot="n1p0r2",
        node=1,
        local_rank=0,
        node_name="gpu7",
        backend="nccl",
        injections=tuple(injections.parse(["kill:rank=1:step=3", "node:2:step=5"])),
        heartbeat_s=0.25,
        reform_timeout_s=30.0,
        replication_factor=3,
        liveness_port=4242,
        run_secret="ab" * 16,
        preempt_signal="TERM",
        log_dir="/logs/run",
        tiers=TierConfig(job_id="77", persistent_dir="/p"),
    )


def test_round_trip_through_the_environment():
    env = full()
    assert RankEnv.from_environ(env.to_environ()) == env
    assert env.to_environ()["LOCAL_RANK"] == "0"
    assert "ab" * 16 not in repr(env)  # the run's secret is never printed


def test_a_liveness_port_without_the_runs_secret_is_refused():
    environ = full().to_environ()
    for secret in ("", "not-hex", "ab" * 4):
        with pytest.raises(RankEnvError, match="SRES_RUN_SECRET is missing or malformed"):
            RankEnv.from_environ({**environ, "SRES_RUN_SECRET": secret})


def test_defaults_fill_what_an_older_supervisor_did_not_set():
    env = RankEnv.from_environ({"SRES_STORE_PORT": "1234", "SRES_SLOT": "n0p0"})
    assert (
        env.heartbeat_s,
        env.reform_timeout_s,
        env.replication_factor,
        env.backend,
        env.preempt_signal,
    ) == (0.5, 60.0, 2, "gloo", "USR2")


def test_not_started_by_sres():
    assert RankEnv.from_environ({}) is None


def test_a_placement_adds_the_node_name_through_the_contract():
    env = {**full().to_environ(), **node_name_environ("gpu9")}
    assert RankEnv.from_environ(env).node_name == "gpu9"


@pytest.mark.parametrize(
    "change, words",
    [
        ({"SRES_STORE_PORT": "x"}, "bad rank environment"),
        ({"SRES_BACKEND": "mpi"}, "gloo or nccl"),
        ({"SRES_HEARTBEAT_S": "0"}, "must be positive"),
        ({"SRES_PREEMPT_SIGNAL": "NOPE"}, "not a signal name"),
    ],
)
def test_a_malformed_environment_is_one_clear_line(change, words):
    with pytest.raises(RankEnvError, match=words):
        RankEnv.from_environ({**full().to_environ(), **change})


def test_run_options_override_and_unknown_ones_are_refused():
    env = RankEnv.from_environ(full().to_environ(), backend="gloo", heartbeat_s=1.0)
    assert (env.backend, env.heartbeat_s) == ("gloo", 1.0)
    with pytest.raises(OptionError, match="unknown option 'heartbeat' .*known: backend"):
        RankEnv.from_environ(full().to_environ(), heartbeat=1.0)


def test_resilience_run_refuses_an_unknown_option_even_without_sres(monkeypatch):
    monkeypatch.delenv("SRES_STORE_PORT", raising=False)
    with pytest.raises(OptionError, match="unknown option 'bakend'"):
        resilience.run(lambda ctx: None, bakend="gloo")
