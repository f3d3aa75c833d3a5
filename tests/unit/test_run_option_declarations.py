"""Each run option's declaration names only places that exist: a misspelt config or rank field
would otherwise pass an option nowhere without a word (launcher.run.options)."""

import dataclasses

from launcher.observability.straggler import StragglerConfig
from launcher.run.option_spec import declared
from launcher.run.options import RunOptions, passed_on, rank_fields
from launcher.supervisor.config import RunConfig
from resilience.contract.elastic_config import ElasticConfig
from resilience.contract.rank_env import RankEnv


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_option_is_declared():
    assert [f.name for f, _ in declared(RunOptions)] == [f.name for f in dataclasses.fields(RunOptions)]


def test_each_config_a_declaration_names_exists():
    for into, cls in (("", RunConfig), ("elastic", ElasticConfig), ("straggler", StragglerConfig)):
        assert set(passed_on(into).values()) <= names(cls), into
    assert {
        spec.config.partition(".")[0]
        for _, spec in declared(RunOptions)
        if spec.config and "." in spec.config
    } <= {
        "elastic",
        "straggler",
    }


def test_each_rank_field_a_declaration_names_exists_and_passes_as_it_is():
    assert {spec.rank for _, spec in declared(RunOptions) if spec.rank} <= names(RankEnv)
    assert set(rank_fields()) <= names(RunConfig) & names(RankEnv)
    assert {"backend", "copy_pace", "preempt_signal"} <= set(rank_fields())
