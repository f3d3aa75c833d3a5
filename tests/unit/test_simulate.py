"""``sres simulate``, the command: measured costs in, the calibration, the tables and the plot out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.observability.goodput_inputs import measured_ladder
from launcher.observability.goodput_strategies import Ladder


def fault_run(kinds_and_seconds: list[tuple[str, float]]) -> list[dict]:
    events = [{"event": "start", "t": 0.0}]
    for generation, (kind, seconds) in enumerate(kinds_and_seconds, start=2):
        events += [
            {"event": "fault", "kind": kind, "rank": 1, "t": float(generation)},
            {
                "event": "replaced",
                "rank": 1,
                "node": 7 if kind == "node" else 1,
                "how": "spare",
                "t": float(generation),
            },
            {
                "event": "recovered",
                "generation": generation,
                "seconds": seconds,
                "steps_lost": 0,
                "t": generation + seconds,
            },
        ]
    return events + [{"event": "finished", "goodput_by_cause": {"productive": 95.0, "checkpoint": 5.0}}]


def test_each_rung_is_the_median_of_the_recoveries_it_took():
    events = fault_run([("kill", 0.4), ("exception", 0.2), ("kill", 0.3), ("node", 0.9), ("hang", 3.3)])
    events.insert(-1, {"event": "resize", "from_world": 4, "to_world": 3, "why": "preempted", "seconds": 0.7})
    ladder, sources = measured_ladder(events, Ladder())
    assert (ladder.inprocess_s, ladder.spare_s, ladder.shrink_s) == (0.3, 0.9, 0.7)  # the hang is left out
    assert ladder.steady_overhead == 0.05 and ladder.node_start_s == Ladder().node_start_s
    assert sources["inprocess_s"] == "median of 3 measured" and sources["node_start_s"].startswith("default")
    with pytest.raises(ValueError, match="no recovery to measure"):
        measured_ladder([{"event": "finished"}], Ladder())


def test_the_costs_were_measured_at_the_world_size_of_the_recovered_generations():
    events = fault_run([("kill", 0.4), ("kill", 0.3), ("kill", 0.5)])
    recovered = [i for i, e in enumerate(events) if e["event"] == "recovered"]
    for i, world in reversed(list(zip(recovered, (8, 16, 16)))):
        events.insert(i, {"event": "generation", "generation": events[i]["generation"], "world_size": world})
    ladder, sources = measured_ladder(events, Ladder())
    assert (ladder.measured_ranks, sources["measured_ranks"]) == (16, "median of 3 measured")
    ladder, sources = measured_ladder(fault_run([("kill", 0.4)]), Ladder())  # no generation events
    assert ladder.measured_ranks == 4 and sources["measured_ranks"].startswith("default")


@pytest.mark.local  # spawns: python -m launcher.cli simulate
def test_the_command_prints_its_tables_and_writes_a_plot_only_where_asked(tmp_path):
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in fault_run([("kill", 0.4)] * 3))
    )
    cmd = [sys.executable, "-m", "launcher.cli", "simulate", str(tmp_path), "--gpus", "1024,16384"]
    done = subprocess.run(
        [*cmd, "--trials", "5", "--days", "2"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "preset llama3" in out and "within the tolerance" in out and "median of 3 measured" in out
    assert out.count("restart from checkpoint") == 5 and "what moves our goodput at 16,384 GPUs" in out
    assert "   1,024 GPUs: control path" in out and "extrapolated beyond the curve's" in out
    assert not list(tmp_path.glob("*.png"))  # no plot into the current directory uninvited
    plot = tmp_path / "out" / "goodput.png"
    done = subprocess.run(
        [*cmd, "--trials", "2", "--days", "1", "--plot", str(plot)], capture_output=True, text=True
    )
    assert done.returncode == 0 and plot.read_bytes()[:4] == b"\x89PNG", done.stderr
    for bad in (
        ["--gpus", "1001"],
        ["--failures-per-node-hour", "-1"],
        ["--refill-s", "nan"],
        ["--days", "1e9"],
        ["--control-curve", str(tmp_path / "events.jsonl")],  # not a curve
    ):
        refused = subprocess.run([*cmd[:4], *bad], capture_output=True, text=True, timeout=60)
        last = refused.stderr.splitlines()[-1]  # a usage error prints the usage above its line
        assert refused.returncode in (1, 2) and "Traceback" not in refused.stderr, (bad, refused.stderr)
        assert last.startswith(("sres: error:", "sres simulate: error:")), (bad, refused.stderr)
