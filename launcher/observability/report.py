"""``sres report RUN_DIR``: one self-contained HTML page of what a run went through and what it cost.

Reads the run's ``events.jsonl`` and ``step_times.jsonl``; writes PNGs beside the page and the
same images inline in it (``data:`` URIs), so the page opens from disk anywhere, with no
network and no script. A run that failed or is still going gets a partial report that says so.
"""

from __future__ import annotations

import argparse
import base64
import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.observability import goodput
from launcher.errors import ConfigError
from launcher.observability.events import read_events
from launcher.observability.timeline import Event, Timeline
from launcher.supervisor.observe import step_reports
from resilience.contract.run_dir import RunDir


@dataclass(frozen=True)
class RunData:
    events: Timeline
    steps: list[dict[str, Any]]
    """One record per rank and step (``step_times.jsonl``)."""

    @property
    def end(self) -> Event | None:
        """How the newest run ended; None while it runs. A requeued job's log holds the earlier
        runs' ``requeue`` events too: taken for the running one's end, they made its account end
        before it started (a 30-minute borrowing run, requeued once, read 0% goodput)."""
        return goodput.last_run(self.events).last("finished", "failed", "requeue")

    @property
    def start_t(self) -> float:
        return goodput.last_run(self.events)[0]["t"]

    @property
    def end_t(self) -> float:
        times = [e["t"] for e in self.events] + [s["t"] for s in self.steps]
        return self.end["t"] if self.end else max(times)


def load(run_dir: Path) -> RunData:
    path = RunDir(run_dir).events
    if not path.exists():
        raise ConfigError(f"{run_dir}: no {path.name} (give the log dir of an sres run)")
    events = read_events(path)
    run = goodput.last_run(events)
    if not run:
        raise ConfigError(f"{path}: no start event yet")
    start = run[0]["t"]
    return RunData(events, [s for s in step_reports.read_file(run_dir) if s.get("t", start) >= start])


def causes(data: RunData) -> dict[str, float]:
    """The finished event's account, or one made now from the steps seen (a partial run)."""
    end = data.end
    if end is not None and end.get("goodput_by_cause"):
        return dict(end["goodput_by_cause"])
    rank0 = [s for s in data.steps if s["rank"] == 0]
    done = {s["step"] for s in rank0}
    first = min((s["t"] for s in rank0), default=None)
    # The median useful step comes from the step records themselves (none: no step was done).
    return goodput.account(data.events, data.end_t, len(done), None, first, data.steps)


def fault_rows(data: RunData) -> list[dict[str, Any]]:
    """Each fault with the recovery that followed it (the first ``recovered`` after it)."""
    run = goodput.last_run(data.events)
    rows = []
    for i, fault in enumerate(run.of("fault")):
        later = [e for e in run.of("recovered") if e.t >= fault.t]
        rec = later[0] if later else {}
        release = _at_least_zero(rec.get("release_s"))  # logs before it was clamped
        rows.append(
            {
                "#": i + 1,
                "kind": fault["kind"],
                "rank": fault.get("rank"),
                "host": fault.get("host"),
                "step": fault.get("step"),
                "detection s": release,
                "re-form s": _minus(rec.get("reform_s"), release),
                "transfer s": rec.get("transfer_s"),
                "first step s": rec.get("first_step_s"),
                "recovery s": rec.get("seconds"),
                "from": rec.get("source"),
                "steps lost": rec.get("steps_lost"),
            }
        )
    return rows


WAITED_S = 0.001
"""A commit that waited less than this for the previous one's copies did not wait."""


def protection_rows(data: RunData) -> list[dict[str, Any]]:
    """What being protected cost: the time commits waited for the previous commit's background
    copies (snapshot, buddy copies, tiers), for all ranks and for the rank that waited most,
    against their step time. The copies run while the next step computes: a step that gave them
    enough time waits 0."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for s in data.steps:
        by_rank.setdefault(s["rank"], []).append(s)
    if not by_rank:
        return []
    worst = max(by_rank, key=lambda r: sum(s.get("blocked_s", 0.0) for s in by_rank[r]))
    everyone = [s for steps in by_rank.values() for s in steps]
    return [_protection_row("all ranks", everyone), _protection_row(f"most (rank {worst})", by_rank[worst])]


def _protection_row(who: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    blocked = sorted(s.get("blocked_s", 0.0) for s in steps)
    waited, step_s = sum(blocked), sum(s.get("step_s") or 0.0 for s in steps)
    return {
        "ranks": who,
        "steps": sum(s.get("steps", 1) for s in steps),  # a large run's record is a window of steps
        "waited s": waited,
        "share of step time": f"{waited / step_s:.2%}" if step_s else None,
        "median s": statistics.median(blocked),
        "max s": blocked[-1],
        "steps that waited": sum(b >= WAITED_S for b in blocked),
    }


def cadence_rows(data: RunData) -> list[dict[str, Any]]:
    """The protection budget's decisions (``protection`` events): how often the RAM and
    neighbour tiers copied a commit, from which step, and how many steps were at risk."""
    return [
        {
            "from step": e["step"],
            "every": e["every"],
            "steps at risk": e["steps_at_risk"],
            "overhead": f"{e['overhead']:.2%}",
            "budget": f"{e['budget']:.2%}",
        }
        for e in data.events
        if e.is_("protection")
    ]


def render(run_dir: Path, out: Path | None = None) -> Path:
    from launcher.observability import report_plots

    data = load(run_dir)
    out = out or RunDir(run_dir).report_html
    out.parent.mkdir(parents=True, exist_ok=True)
    account = causes(data)
    images = {
        "timeline": RunDir.report_picture(out, "timeline"),
        "goodput": RunDir.report_picture(out, "goodput"),
        "heatmap": RunDir.report_picture(out, "ranks"),
    }
    report_plots.timeline(images["timeline"], data.start_t, data.steps, goodput.last_run(data.events))
    report_plots.goodput_bar(images["goodput"], account)
    report_plots.heatmap(images["heatmap"], data.steps)
    out.write_text(page(run_dir, data, account, images))
    return out


def page(run_dir: Path, data: RunData, account: dict[str, float], images: dict[str, Path]) -> str:
    end = data.end
    if end is None:
        state = "<p class=warn>Partial report: the run has not ended (still running, or interrupted).</p>"
    elif end.is_("failed"):
        state = f"<p class=warn>Partial report: the run FAILED: {html.escape(str(end.get('reason')))}</p>"
    elif end.is_("requeue"):
        state = (
            f"<p class=warn>Partial report: the job was requeued ({html.escape(str(end.get('why')))}).</p>"
        )
    else:
        state = f"<p>Finished: {end['steps']} steps, goodput <b>{(end.get('goodput') or 0):.1%}</b>.</p>"
    wall = sum(account.values())
    cause_rows = "".join(
        f"<tr><td>{c}</td><td>{s:.2f}</td><td>{s / wall:.1%}</td></tr>" if wall else ""
        for c, s in account.items()
    )
    faults = fault_rows(data)
    fault_table = html_table(faults) if faults else "<p>No fault.</p>"
    protection = protection_rows(data)
    protection_table = html_table(protection) if protection else "<p>No step recorded.</p>"
    cadence = cadence_rows(data)
    cadence_table = (
        f"<p>The tiers' cadence under the protection budget:</p>{html_table(cadence)}"
        if cadence
        else "<p>The tiers copied every commit they were given (no protection budget in force).</p>"
    )
    start = goodput.last_run(data.events)[0]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sres report: {html.escape(str(run_dir))}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#eee}}.warn{{color:#a00;font-weight:bold}}img{{max-width:100%}}</style></head><body>
<h1>Run report</h1>
<p>{html.escape(str(run_dir))}: {start.get("nodes")} node(s) x {start.get("procs_per_node")} rank(s),
{start.get("spares")} spare(s), wall time {wall:.1f} s.</p>
{state}
<h2>Step time</h2>{img_tag(images["timeline"], "step time over wall time")}
<h2>Where the time went</h2>{img_tag(images["goodput"], "goodput by cause")}
<table><tr><th>cause</th><th>seconds</th><th>share</th></tr>{cause_rows}</table>
<h2>What protection cost</h2>
<p>Time commits waited for the previous commit's copies (snapshot, buddy copies, checkpoint
tiers), which run while the next step computes.</p>{protection_table}
{cadence_table}
<h2>Compute time per rank</h2>{img_tag(images["heatmap"], "compute time per rank and step")}
<h2>Faults</h2>{fault_table}
</body></html>
"""


def img_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def html_table(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def text_table(columns: Sequence[str], rows: list[dict[str, Any]], right: bool = False) -> str:
    """The same rows for a terminal: aligned columns; None is "-", True "yes", False blank."""

    def cell(value: Any) -> str:
        return "-" if value is None else "yes" if value is True else "" if value is False else str(value)

    text = [list(columns)] + [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in text) for i in range(len(columns))]
    align = str.rjust if right else str.ljust
    return "\n".join("  ".join(align(c, w) for c, w in zip(row, widths)).rstrip() for row in text)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else html.escape(str(value))


def _at_least_zero(seconds: float | None) -> float | None:
    return None if seconds is None else max(0.0, seconds)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None else a - (b or 0.0)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="an HTML report of a run: step time, goodput by cause, ranks, faults",
        description="Write a self-contained HTML page (images inline) and its PNGs for a run's log "
        "dir; a run that failed or is still going gets a partial report.",
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="the HTML file (default RUN_DIR/report.html)")
    p.set_defaults(func=lambda args: print(f"report: {render(args.run_dir, args.out)}") or 0)
