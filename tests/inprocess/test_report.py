"""``sres report`` on a real run with a node kill, a process kill and a resize, rendered by a
real headless browser (Debian's chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from launcher.observability import report
from tests.support.browser import assert_renders
from tests.support.sres_runs import sres_run


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """3 nodes, no spare, may shrink to 2: the node loss is a resize (3 -> 2), then a rank is killed."""
    run = sres_run(
        tmp_path_factory.mktemp("report"),
        "--no-tiers",
        "--min-nodes",
        "2",
        "--max-nodes",
        "3",
        "--inject",
        "node:1:step=8",
        "--inject",
        "kill:rank=0:step=16",
        nodes=3,
        steps=26,
        train_args=("--sleep-s", "0.05"),
    )
    assert run.returncode == 0, run.stderr
    assert [e["kind"] for e in run.of("fault")] == ["node", "kill"] and run.of("resize")
    return run


def make_report(run_dir, out):
    done = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "report", str(run_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out.read_text()


def test_the_page_is_self_contained_and_lists_every_fault(faulty_run, tmp_path):
    page = make_report(faulty_run.log_dir, tmp_path / "r" / "report.html")
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(href|src)="(?!data:)', page) and "<script" not in page
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == [
        "report-goodput.png",
        "report-ranks.png",
        "report-timeline.png",
    ]
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\w+)</td>", page)
    assert [kind for _, kind in rows] == ["node", "kill"]
    assert "What protection cost" in page
    data = report.load(faulty_run.log_dir)
    every, most = report.protection_rows(data)
    assert every["steps"] == len(data.steps) and every["steps"] >= most["steps"] > 0
    assert most["waited s"] >= every["waited s"] / 3 and every["median s"] < 0.05  # copies overlap steps
    wall = data.end_t - data.start_t
    assert sum(report.causes(data).values()) == pytest.approx(wall, rel=0.01)


def test_an_unfinished_run_gets_a_partial_report(faulty_run, tmp_path):
    shutil.copytree(faulty_run.log_dir, tmp_path / "run", ignore=shutil.ignore_patterns("report*"))
    events = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    cut = next(i for i, line in enumerate(events) if json.loads(line)["event"] == "resize")
    (tmp_path / "run" / "events.jsonl").write_text("\n".join(events[: cut + 1]) + "\n")
    page = make_report(tmp_path / "run", tmp_path / "partial.html")
    assert "Partial report: the run has not ended" in page
    assert sum(report.causes(report.load(tmp_path / "run")).values()) > 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is installed by tests/run.sh")
def test_a_real_browser_renders_it_without_errors(faulty_run, tmp_path):
    out = tmp_path / "report.html"
    make_report(faulty_run.log_dir, out)
    assert_renders(out, tmp_path / "shot.png")
