"""The generated reference pages (docs/reference/cli.md, events.md, environment.md, modules.md)
are what ``python docs/generate.py`` would write now: a new option, event, variable or module
(or a module's docstring changed) without the pages regenerated fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from pathlib import Path

import pytest

from launcher.observability import event_types

ROOT = Path(__file__).resolve().parents[2]
FIX = "stale: run `python docs/generate.py` and commit docs/reference/"


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(generate):
    return generate.pages()


def test_every_generated_page_is_current(generate, written):
    assert generate.stale(written, generate.REFERENCE) == [], FIX


def test_an_option_added_to_a_parser_makes_cli_md_stale(generate, written):
    parser = generate.build_parser()
    run = next(sub for name, _, sub in generate._subcommands(parser) if name == "run")
    run.add_argument("--brand-new", metavar="N", default=7, help="an option nobody documented")
    page = generate.cli_page(parser)
    assert "| `--brand-new` | `N` | `7` | an option nobody documented |" in page
    assert generate.stale({"cli.md": page}, generate.REFERENCE) == ["cli.md"]
    assert generate.cli_page() == written["cli.md"], "the change stayed in that parser"


def test_a_field_added_to_an_event_makes_events_md_stale(generate, written, monkeypatch):
    first, *rest = event_types.EVENT_TYPES
    more = dataclasses.replace(first, fields=(*first.fields, event_types.Field("new", "int", "undocumented")))
    monkeypatch.setattr(event_types, "EVENT_TYPES", (more, *rest))
    assert generate.stale({"events.md": generate.events_page()}, generate.REFERENCE) == ["events.md"]


def test_modules_md_is_every_module_by_folder_from_its_docstring(generate, written, tmp_path):
    """Read with ast, never imported: a module that would fail to import still gets its row."""
    for folder, doc in {"launcher": "The launcher.", "launcher/cli": "One | two.", "resilience": ""}.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text(f'"""{doc}\n\nMore."""\n' if doc else "")
    (tmp_path / "launcher" / "cli" / "__main__.py").write_text('"""Left out."""\n')
    (tmp_path / "launcher" / "cli" / "b.py").write_text(
        '"""See :class:`~x.y.Thing`.\n\nNot shown."""\nraise X\n'
    )
    (tmp_path / "launcher" / "cli" / "a.py").write_text("import nothing_at_all\n")
    page = generate.modules_page(tmp_path, "HEADER", generate.text, generate.cell)
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections == ["## `launcher/`", "## `launcher/cli/`", "## `resilience/`"]
    assert (
        "One | two.\n\n| module | what it is for |\n|---|---|\n| `a.py` |  |\n| `b.py` | See `Thing`. |\n"
        in page
    )
    assert "## `launcher/`\n\nThe launcher.\n\n## `launcher/cli/`" in page  # no modules, no table
    assert "Left out" not in page and "More." not in page and "Not shown" not in page
    assert "## `slurm_plugins/checks/`" in written["modules.md"] and "| `entry.py` |" in written["modules.md"]


def test_check_exits_1_naming_the_stale_page_and_writing_nothing(
    generate, written, tmp_path, monkeypatch, capsys
):
    shutil.copytree(generate.REFERENCE, tmp_path, dirs_exist_ok=True)
    (tmp_path / "environment.md").write_text(written["environment.md"] + "a hand edit\n")
    monkeypatch.setattr(generate, "REFERENCE", tmp_path)
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr().err == "docs/reference/environment.md is stale: run python docs/generate.py\n"
    assert (tmp_path / "environment.md").read_text().endswith("a hand edit\n")
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0


def test_the_pages_do_not_depend_on_the_environment_or_the_terminal(generate, written, monkeypatch):
    """SRES_* variables become sres run's defaults, and argparse wraps to $COLUMNS: neither shows."""
    monkeypatch.setenv("SRES_STANDBY", "3")
    monkeypatch.setenv("SRES_BACKEND", "nccl")
    monkeypatch.setenv("COLUMNS", "40")
    assert generate.pages() == written
