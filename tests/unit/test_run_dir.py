"""The log dir's files are named once, in resilience/contract/run_dir.py, and documented once,
in docs/reference/run-directory.md: the two lists agree, RunDir's paths are the page's, and no
other module of ours spells a file name (a new spelling fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from resilience.contract import run_secret
from resilience.contract.run_dir import RunDir
from launcher.supervisor import control

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "resilience", "slurm_plugins")
PAGE = ROOT / "docs" / "reference" / "run-directory.md"
SAMPLE = {"<slot>": "n0p1", "<R>": "3", "<job id>": "4242"}
"""A value for each varying part the page's names have."""


def _page_files() -> set[str]:
    """The names in the first column of the page's "The log dir" table."""
    section = PAGE.read_text().split("\n## The log dir\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_run_dir_lists_the_files_the_page_lists():
    assert set(RunDir.FILES) == _page_files()
    assert all(meaning.strip() for meaning in RunDir.FILES.values())


def test_run_dir_paths_are_the_pages(tmp_path: Path):
    files = RunDir(tmp_path)
    made = [
        files.events,
        files.step_times,
        files.rank_log(SAMPLE["<slot>"]),
        files.fault_schedule,
        files.control_address,
        files.control_token,
        files.secret,
        files.samples(int(SAMPLE["<R>"])),
        files.satellite_output(SAMPLE["<job id>"]),
        files.report_html,
        *(RunDir.report_picture(files.report_html, kind) for kind in ("timeline", "goodput", "ranks")),
    ]
    page = set()
    for name in _page_files():
        for part, value in SAMPLE.items():
            name = name.replace(part, value)
        page.add(name)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in made) == sorted(page)
    assert files.ranks == files.rank_log("x").parent == tmp_path / "ranks"
    assert files.samples_dir == files.samples(0).parent == tmp_path / "samples"
    assert files.satellite_output("%j").name == "satellite-%j.out"  # sbatch's --output pattern


def test_report_pictures_follow_the_pages_stem(tmp_path: Path):
    assert (
        RunDir.report_picture(tmp_path / "out" / "mine.html", "goodput")
        == tmp_path / "out" / "mine-goodput.png"
    )


def test_sample_files_are_each_ranks_in_order(tmp_path: Path):
    files = RunDir(tmp_path)
    files.samples_dir.mkdir()
    for rank in (1, 0):
        files.samples(rank).write_text("")
    (files.samples_dir / "notes.txt").write_text("")
    assert files.sample_files() == [files.samples(0), files.samples(1)]


def test_the_old_names_still_name_the_same_files(tmp_path: Path):
    assert tmp_path / run_secret.KEPT == RunDir(tmp_path).secret
    assert tmp_path / control.ADDRESS_FILE == RunDir(tmp_path).control_address
    assert tmp_path / control.TOKEN_FILE == RunDir(tmp_path).control_token


def _name_patterns() -> list[re.Pattern[str]]:
    """A regular expression per name of the page, matching the end of a path, ``<...>`` any
    part of a name (``{}`` in an f-string, ``*`` in a glob, ``%j`` for sbatch). A name in a
    folder also without its folder, unless it starts with its varying part (``<slot>.log``
    alone is any log: ``ranks/<slot>.log`` is found only whole); a report picture also
    after any stem (``{}-timeline.png``)."""
    out = []
    for name in RunDir.FILES:
        base = name.rsplit("/", 1)[-1]
        pieces = {name, base} if not base.startswith("<") else {name}
        pieces |= {base.replace("report-", "<stem>-")} if re.fullmatch(r"report-\w+\.png", base) else set()
        for piece in pieces:
            rx = re.sub(r"<[^>]+>", r"[^/\\s]+", re.escape(piece))
            out.append(re.compile(rf"(?:^|/){rx}$"))
    return out


def _spelled(text: str) -> list[str]:
    """The string literals of a module's source that are (or end in) a log dir file's name:
    every constant and f-string (its values as ``{}``) but a bare string statement (a
    docstring) or a sentence (whitespace: a message or a help text that mentions the file)."""
    tree = ast.parse(text)
    skipped = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    skipped |= {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    patterns = _name_patterns()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            value = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            value = node.value
        else:
            continue
        if not re.search(r"\s", value) and any(p.search(value) for p in patterns):
            found.append((node.lineno, value))
    return [f"{line}: {value!r}" for line, value in sorted(found)]


def test_no_module_spells_a_log_dir_file_name():
    where = ROOT / "resilience" / "contract" / "run_dir.py"
    spelled = {
        path.relative_to(ROOT).as_posix(): found
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != where and (found := _spelled(path.read_text()))
    }
    assert spelled == {}, "name the file through resilience.contract.run_dir.RunDir"


def test_the_check_finds_the_spellings_it_is_for():
    source = """
log_dir / "events.jsonl"
open(f"{log_dir}/control.token")
folder.glob("rank-*.jsonl")
(log_dir / "ranks" / f"{slot}.log", f"ranks/{slot}.log")
f"--output={log_dir / 'satellite-%j.out'}"
out.with_name(f"{out.stem}-ranks.png")
'''a docstring that names events.jsonl'''
print("no events.jsonl in", log_dir)
"""
    assert [line.split(":")[0] for line in _spelled(source)] == ["2", "3", "4", "5", "6", "7"]
