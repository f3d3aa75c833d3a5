"""Bad values on the command line end in one line, never a traceback, and never silently:
a nan compares false with every bound, so a nan timeout used to turn its check off."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.cli.parser import main
from launcher.errors import ConfigError
from launcher.run.request import RunOptions


def run_args(tmp_path, *flags: str) -> list[str]:
    return [
        "run",
        "--nodes",
        "1",
        "--launcher",
        "local",
        "--log-dir",
        str(tmp_path / "logs"),
        *flags,
        "--",
        "true",
    ]


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (("--reform-timeout", "-1"), "sres: error: --reform-timeout must be positive (got -1)"),
        (
            ("--metrics-port", "70000"),
            "sres: error: --metrics-port 70000: a port is 0..65535 (0: any free one)",
        ),
    ],
)
def test_a_bad_run_value_is_one_line(tmp_path, capsys, flags, line):
    assert main(run_args(tmp_path, *flags)) == 1
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize(
    "argv",
    [
        ["--hang-timeout", "nan"],
        ["--straggler-factor", "nan"],
        ["--reform-timeout", "inf"],
        ["--drain-grace", "inf"],
    ],
)
def test_a_non_finite_number_is_a_usage_error(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as done:
        main(run_args(tmp_path, *argv))
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()  # one line, no usage block before it
    assert err == [
        f"sres run: error: argument {argv[0]}: '{argv[1]}' is not a finite number (see 'sres run --help')"
    ]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["bogus"], "sres: error: argument COMMAND: invalid choice: 'bogus' (choose from "),
        (
            ["run", "--nodes"],
            "sres run: error: argument --nodes: expected one argument (see 'sres run --help')",
        ),
        (["hooks", "install"], "sres hooks install: error: the following arguments are required: --nodes"),
    ],
)
def test_a_usage_error_is_one_line_that_points_to_help(capsys, argv, line):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    [err] = capsys.readouterr().err.splitlines()
    assert err.startswith(line) and err.endswith("--help')"), err


def test_sres_hooks_alone_prints_the_same_one_line(capsys):
    from slurm_plugins.cli import main as hooks_main

    with pytest.raises(SystemExit):
        hooks_main(["hooks", "check", "--no-such-flag"])
    assert capsys.readouterr().err.splitlines() == [
        "sres: error: unrecognized arguments: --no-such-flag (see 'sres --help')"
    ]


def test_simulate_refuses_a_nan_length_instead_of_running_forever(capsys):
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--recovery-s", "1", "--days", "nan"])
    assert done.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "sres simulate: error: argument --days: 'nan' is not a finite number (see 'sres simulate --help')"
    )


@pytest.mark.parametrize("value", ["nan", float("nan"), "inf", float("-inf")])
def test_options_from_the_environment_or_json_refuse_non_finite_numbers(value):
    """submitit's job process and the environment give options as text or JSON values."""
    with pytest.raises(ConfigError, match=r"^--hang-timeout: .* is not a number$"):
        RunOptions(hang_timeout=value)


@pytest.mark.parametrize("command", ["report", "simulate"])
def test_a_corrupt_events_file_is_one_line(tmp_path, capsys, command):
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "started", "t": 1}\n{{not json\n{"event": "finished", "t": 2}\n')
    argv = [command, str(tmp_path)] if command == "report" else [command, str(events)]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"sres: error: {events}:2: not a JSON record (a corrupt log?)"
    ]


def test_a_tier_setting_of_the_wrong_type_is_one_line(tmp_path, capsys):
    settings = tmp_path / "tiers.yaml"
    settings.write_text("keep_ram: two\n")
    assert main(run_args(tmp_path, "--tier-config", str(settings))) == 1
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "sres: error: tier settings: keep_ram: 'two' is not a whole number"
    )


@pytest.mark.local  # starts a supervisor (its servers), though no rank starts
def test_a_training_command_that_does_not_exist_is_one_line(tmp_path):
    argv = [*run_args(tmp_path)[:-1], "/nonexistent/python", "train.py"]
    done = subprocess.run(
        [sys.executable, "-m", "launcher.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [
        "sres: error: cannot start /nonexistent/python: No such file or directory (the training command)"
    ]


BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi"))
    + "keep_ram: *i\n"
)


@pytest.mark.parametrize("flag", ["--tier-config", "--elastic-config"])
def test_a_yaml_alias_bomb_in_a_settings_file_is_one_short_line(tmp_path, capsys, flag):
    """Nine lines of nested aliases are a billion entries: they were expanded and printed whole
    into the error. Data that expands past what settings hold is refused, unprinted."""
    settings = tmp_path / "settings.yaml"
    settings.write_text(BOMB)
    assert main(run_args(tmp_path, flag, str(settings))) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("sres: error: ") and "expands to more than" in line and len(line) < 400, line


def test_a_local_run_of_more_ranks_than_one_machine_holds_is_refused(tmp_path, capsys):
    """``--nodes 100000`` on the local launcher started a run that would fork 100,000 ranks."""
    assert main(run_args(tmp_path, "--nodes", "100000")) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("sres: error: --nodes 100000 x --procs-per-node 1") and "at most 512" in line
    assert not (tmp_path / "logs").exists()  # refused before anything was made


WRONG_TYPES = [
    ('{"event": "start", "t": "yesterday"}', "field 't' of a 'start' event is \"yesterday\", not float"),
    ('{"event": "fault", "kind": 5, "rank": 1, "t": 1}', "field 'kind' of a 'fault' event is 5, not str"),
    (
        '{"event": "recovered", "seconds": Infinity, "t": 1}',
        "field 'seconds' of a 'recovered' event is inf, not float",
    ),
    ('{"event": "replaced", "rank": [1], "t": 1}', "field 'rank' of a 'replaced' event is [1], not int"),
    ('{"event": "finished", "steps": true, "t": 1}', "field 'steps' of a 'finished' event is true, not int"),
    ('{"event": "newer-kind", "t": NaN}', "field 't' of a 'newer-kind' event is nan, not float"),
]


@pytest.mark.parametrize("command", ["report", "simulate"])
@pytest.mark.parametrize(
    ("line", "says"), WRONG_TYPES, ids=[w[1].split()[1] + w[1].split()[4] for w in WRONG_TYPES]
)
def test_an_event_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, capsys, command, line, says):
    """A hand-edited or corrupt log: what readers compute with (times subtracted, counts added)
    must be of its declared type, or the reader stops at that line in one line."""
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "start", "t": 1}\n' + line + "\n")
    argv = [command, str(tmp_path)] if command == "report" else [command, str(events)]
    assert main(argv) == 1
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith(f"sres: error: {events}:2: {says}") and error.endswith(" (a corrupt log?)"), error


@pytest.mark.local  # starts a supervisor's servers, though no rank starts
def test_a_metrics_textfile_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path):
    argv = [*run_args(tmp_path, "--metrics-textfile", "/proc/x/y")[:-1], sys.executable, "-c", "pass"]
    done = subprocess.run(
        [sys.executable, "-m", "launcher.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert (
        done.stderr.splitlines()[-1] == "sres: error: --metrics-textfile /proc/x/y: No such file or directory"
    )
