"""The table of SRES_* variables that stand for sres options (launcher.run.environment)."""

import argparse

from launcher.cli import run_options
from launcher.run import environment


def test_an_option_names_its_variable():
    assert environment.variable("--preempt-signal") == "SRES_PREEMPT_SIGNAL"
    assert environment.variable("--log-dir") == "SRES_LOG_DIR"


def test_the_command_line_wins_and_stops_at_the_training_command():
    env = {"SRES_LOG_DIR": "from-env"}
    assert environment.option_value("--log-dir", [], env) == "from-env"
    assert environment.option_value("--log-dir", ["--log-dir", "a", "--log-dir=b"], env) == "b"
    assert environment.option_value("--log-dir", ["--", "train", "--log-dir", "x"], env) == "from-env"
    assert environment.option_value("--log-dir", ["--log-dir"], {}) is None


def test_the_table_lists_every_option_the_parser_reads_from_the_environment():
    """A new option of sres run/srun gets its line here (the parser reads SRES_<OPTION> for each)."""
    parser = argparse.ArgumentParser()
    run_options.add_supervision_options(parser)  # the options both subcommands read
    actions = parser._actions  # argparse keeps no public list
    options = {o for a in actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    assert {v.option for v in environment.VARIABLES if v.option} == options


def test_each_variable_is_listed_once_with_a_one_line_description():
    names = [v.name for v in environment.VARIABLES]
    assert len(names) == len(set(names))
    assert all(n.startswith(environment.PREFIX) for n in names)
    assert all(v.description and "\n" not in v.description for v in environment.VARIABLES)
    assert all(v.name == environment.variable(v.option) for v in environment.VARIABLES if v.option)


def test_variables_are_read_by_their_kind():
    env = {"SRES_NO_TIERS": "Yes", "SRES_NO_GROW": "0", "SRES_INJECT": "kill:rank=0:step=1; ;node:1:step=2"}
    env |= {"SRES_HANG_TIMEOUT": "7", "SRES_NODES": "9"}  # not an option of the table: not read
    assert environment.values(env) == {
        "no_tiers": True,
        "no_grow": False,
        "inject": ["kill:rank=0:step=1", "node:1:step=2"],
        "hang_timeout": "7",
    }
    assert "inject" not in environment.defaults(env)  # the command line replaces the list
    assert environment.options()["--no-tiers"] is False and environment.options()["--log-dir"] is True
