"""Every ``sres`` subcommand's flags driven with bad values (hypothesis): negative, zero, huge,
nan, inf, the wrong type, missing, a file for a directory, a directory for a file, corrupt
files. Each ends in success or in one ``error:`` line, never a traceback and never a hang.

The commands run in this process (``launcher.cli.parser.main``), as the ``sres`` script runs
them; those whose every valid call trains for minutes (``demo``, ``chaos``) or acts on a
cluster (the hooks that drain, ``install``) are left out, and ``run`` is given a training
program that does not exist, so a valid line ends at the start of training."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.parser import build_parser, main

HANG_S = 30
VALUES = (
    "-1",
    "0",
    "1",
    "2.5",
    "1e400",
    "99999999999",
    "nan",
    "inf",
    "-inf",
    "abc",
    "",
    "{missing}",
    "{file}",
    "{dir}",
    "{corrupt}",
    "{yaml_bomb}",
    "{typed_run}",
)
COMMANDS: dict[tuple[str, ...], tuple[list[str], list[str]]] = {
    # the command, then what goes before the flag under test and after it
    ("run",): (["--nodes", "1", "--launcher", "local", "--log-dir", "{fresh}"], ["--", "{missing}"]),
    ("srun",): ([], ["-N", "1", "{missing}"]),
    ("template",): ([], ["train.sbatch"]),
    ("doctor",): (["--timeout", "5"], []),
    ("hooks", "check"): ([], []),
    ("ckpt", "ls"): ([], ["{dir}"]),
    ("ckpt", "verify"): ([], ["{dir}"]),
    ("resize",): (["--nodes", "2"], ["{missing}"]),
    ("grow",): (["--nodes", "1"], ["{missing}"]),
    ("shrink",): (["--nodes", "1"], ["{missing}"]),
    ("status",): ([], ["{typed_run}"]),
    ("simulate",): (["--recovery-s", "1", "--trials", "2", "--plot", "{dir}/plot.png"], []),
    ("report",): ([], ["{corrupt_run}"]),
}
ERROR_LINE = re.compile(r"^sres( [\w-]+)*: error: ")


def _flags(command: tuple[str, ...]) -> list[str]:
    parser: argparse.ArgumentParser = build_parser()
    for word in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return sorted(
        a.option_strings[-1] for a in parser._actions if a.option_strings and a.option_strings[-1] != "--help"
    )


CASES = [(command, flag) for command in COMMANDS for flag in _flags(command)]


@contextmanager
def _no_hang(seconds: int):
    def stuck(signum, frame):
        raise AssertionError(f"still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("inputs")
    (base / "file").write_text("not a directory\n")
    (base / "corrupt").write_bytes(b"\x00\xff{not json\n\x80")
    run = base / "corrupt-run"
    run.mkdir()
    (run / "events.jsonl").write_bytes(b'{"event": "start"\n\xff\xfe garbage\n')
    (base / "dir").mkdir()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # expands to 9**9 values
        f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi")
    )
    (base / "bomb.yaml").write_text(bomb + "keep_ram: *i\n")
    typed = base / "typed-run"
    typed.mkdir()
    (typed / "events.jsonl").write_text(
        '{"event": "start", "t": 1}\n{"event": "fault", "kind": 5, "rank": "x", "t": "later"}\n'
        '{"event": "recovered", "seconds": Infinity, "t": 2}\n'
    )
    return {
        "{yaml_bomb}": str(base / "bomb.yaml"),
        "{typed_run}": str(typed),
        "{missing}": str(base / "missing" / "x"),
        "{file}": str(base / "file"),
        "{dir}": str(base / "dir"),
        "{corrupt}": str(base / "corrupt"),
        "{corrupt_run}": str(run),
    }


def _fill(words: list[str], places: dict[str, str]) -> list[str]:
    out = []
    places = {**places, "{fresh}": str(Path(places["{dir}"]) / f"log-{uuid.uuid4().hex[:8]}")}
    for word in words:
        for key, value in places.items():
            word = word.replace(key, value)
        out.append(word)
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), value=st.sampled_from(VALUES))
def test_every_flag_with_a_bad_value_is_success_or_one_error_line(case, value, places, capsys, monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SRES_HEALTH_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(places["{dir}"])
    command, flag = case
    before, after = COMMANDS[command]
    argv = _fill([*command, *before, flag, value, *after], places)
    logging.root.handlers.clear()  # a handler of an earlier example writes to its captured stream
    with _no_hang(HANG_S):
        try:
            code = main(argv)
        except SystemExit as done:  # argparse's usage errors, and --help-like flags
            code = done.code if isinstance(done.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    if code != 0:
        errors = [line for line in err.splitlines() if ERROR_LINE.match(line)]
        assert len(errors) == 1, (argv, code, err)


def test_the_cases_cover_every_flag_of_the_commands_driven():
    assert len(CASES) > 80
    assert {flag for command, flag in CASES if command == ("run",)} >= {"--hang-timeout", "--metrics-port"}
