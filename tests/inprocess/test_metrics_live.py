"""Live metrics and the goodput account of a real run: scraped over HTTP and read from the
textfile while it trains and recovers, parsed with prometheus_client's own parser."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.observability.events import read_events
from tests.support.sres_runs import sres_run


def parse(text: str) -> dict[str, float]:
    """Unlabelled samples by name, and labelled ones as name{k=v}; raises on a torn file."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def watch(log_dir: Path, textfile: Path, stop: threading.Event, scrapes: list, files: list) -> None:
    url = None
    while not stop.is_set():
        events = log_dir / "events.jsonl"
        if url is None and events.exists():
            url = next((e["url"] for e in read_events(events) if e["event"] == "metrics"), None)
        if url is not None:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    scrapes.append(parse(response.read().decode()))
            except OSError:  # the run has ended and its endpoint with it
                pass
        if textfile.exists():
            files.append(parse(textfile.read_text()))  # every read is a whole file: it is replaced atomically
        time.sleep(0.25)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One run with a node killed, scraped over HTTP and read from its textfile as it goes."""
    tmp = tmp_path_factory.mktemp("metrics")
    textfile = tmp / "node-exporter" / "sres.prom"
    stop, scrapes, files = threading.Event(), [], []
    watcher = threading.Thread(target=watch, args=(tmp / "run", textfile, stop, scrapes, files), daemon=True)
    watcher.start()
    run = sres_run(
        tmp,
        "--no-tiers",
        "--spares",
        "1",
        "--inject",
        "node:1:step=12",
        "--metrics-port",
        "0",
        "--metrics-textfile",
        str(textfile),
        nodes=3,
        steps=30,
        train_args=("--sleep-s", "0.15"),
    )
    stop.set()
    watcher.join(timeout=10)
    assert run.returncode == 0, run.stderr
    return run, scrapes, files, textfile


def test_metrics_move_with_the_run_and_count_its_fault(live):
    run, scrapes, files, textfile = live
    assert len(scrapes) >= 5, scrapes
    steps = [s["sres_step"] for s in scrapes if "sres_step" in s]
    assert steps == sorted(steps) and steps[-1] > steps[0]  # the step moves as training goes
    assert max(s.get("sres_steps_per_second", 0) for s in scrapes) > 0
    assert (
        scrapes[-1].get("sres_faults_total{kind=node}") == 1
        or files[-1].get("sres_faults_total{kind=node}") == 1
    )
    final = parse(textfile.read_text())  # written once more at the end
    assert final["sres_step"] == 29 and final["sres_running"] == 0
    assert final["sres_faults_total{kind=node}"] == 1 and final["sres_recovery_seconds_count"] == 1
    assert final["sres_world_size"] == 3 and final["sres_generation"] == 2
    assert len({f["sres_step"] for f in files if "sres_step" in f}) >= 3  # rewritten as steps go by
    assert not list(textfile.parent.glob("*.tmp*"))  # no temporary file left beside it
    assert final["sres_goodput_ratio"] == run.of("finished")[0]["goodput"] > 0


def test_the_goodput_account_covers_the_wall_time(live):
    """The causes add up to start -> end, and the fault's costs are in them."""
    run = live[0]
    (start,), (end,) = run.of("start"), run.of("finished")
    causes, wall = end["goodput_by_cause"], end["t"] - start["t"]
    assert sum(causes.values()) == pytest.approx(wall, rel=0.01)
    assert min(causes.values()) >= -0.01 * wall  # "other" is what is left: never meaningfully negative
    assert causes["productive"] >= 28 * 0.15 and causes["startup"] > 0
    assert causes["transfer"] > 0 and causes["reform"] + causes["detection"] > 0
    assert end["goodput"] == pytest.approx(
        causes["productive"] / sum(causes.values()), rel=1e-3
    )  # rounded causes
    assert "wall " in run.stderr and "productive" in run.stderr  # the summary shows the account
