"""Live metrics of a run, in Prometheus/OpenMetrics text (``prometheus_client``).

The supervisor feeds :class:`RunMetrics` with every event it writes (faults, recoveries,
resizes, tier saves, the end) and, about once a second, the newest committed step; the
metrics are served over HTTP (``--metrics-port``, localhost unless ``--metrics-addr`` says
otherwise) and/or written to a file for node_exporter's textfile collector
(``--metrics-textfile``, replaced atomically). Nothing here runs unless asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client import write_to_textfile

from launcher.errors import ConfigError
from launcher.observability.events import EventLog
from launcher.observability.timeline import Event

log = logging.getLogger(__name__)

SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
BLOCKED_BUCKETS = (0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
"""A commit that waits for nothing observes 0: the first bucket counts the steps protection cost nothing."""
RATE_WINDOW_S = 10.0
"""Steps per second are counted over about this long: long enough to smooth single slow steps."""


class RunMetrics:
    """One run's metrics in a registry of their own (never the process-wide default one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        self._progress(self.registry)
        self._faults(self.registry)
        self._costs(self.registry)
        self._steps: list[tuple[float, int]] = []
        self.running.set(1)

    def _progress(self, r: CollectorRegistry) -> None:
        self.step = Gauge("sres_step", "Newest step committed by every rank", registry=r)
        self.steps_per_s = Gauge(
            "sres_steps_per_second", f"Committed steps per second (last ~{RATE_WINDOW_S:g} s)", registry=r
        )
        self.world = Gauge("sres_world_size", "Ranks in the current generation", registry=r)
        self.generation = Gauge("sres_generation", "Current generation (one per re-formation)", registry=r)
        self.running = Gauge(
            "sres_running", "1 while the run goes on, 0 once it finished or failed", registry=r
        )

    def _faults(self, r: CollectorRegistry) -> None:
        self.faults = Counter("sres_faults", "Faults seen, by kind", ["kind"], registry=r)
        self.recovery = Histogram(
            "sres_recovery_seconds", "Fault to the first step after it", registry=r, buckets=SECONDS_BUCKETS
        )
        self.resize = Histogram(
            "sres_resize_seconds",
            "Resize request or fault to the first step of the new world",
            ["why"],
            registry=r,
            buckets=SECONDS_BUCKETS,
        )
        self.steps_lost = Counter("sres_steps_redone", "Steps done again after recoveries", registry=r)

    def _costs(self, r: CollectorRegistry) -> None:
        self.tier_save = Histogram(
            "sres_tier_save_seconds",
            "Checkpoint tier saves, by tier",
            ["tier"],
            registry=r,
            buckets=SECONDS_BUCKETS,
        )
        self.requeues = Counter("sres_requeues", "Requeues of the Slurm job, by cause", ["cause"], registry=r)
        self.goodput = Gauge(
            "sres_goodput_ratio",
            "Share of the run's wall time that became training progress (set at the end)",
            registry=r,
        )
        self.straggler_score = Gauge(
            "sres_straggler_score",
            "A rank's compute time per step over the median of all ranks' (newest step judged)",
            ["rank"],
            registry=r,
        )
        self.stragglers = Counter(
            "sres_stragglers", "Straggler events (a rank slow for --straggler-steps)", registry=r
        )
        self.blocked = Histogram(
            "sres_commit_blocked_seconds",
            "Per rank and step: the commit's wait for the previous commit's snapshot, copies and "
            "buddy round (what protection costs training; docs/guide/reports.md)",
            registry=r,
            buckets=BLOCKED_BUCKETS,
        )
        self.protect_every = Gauge(
            "sres_protection_every",
            "The RAM and neighbour tiers copy every N-th step (the protection budget's cadence)",
            registry=r,
        )
        self.steps_at_risk = Gauge(
            "sres_steps_at_risk", "The most steps a fault redoes when the RAM tier serves it", registry=r
        )
        self.by_cause = Gauge(
            "sres_goodput_seconds",
            "The run's wall time by cause (set at the end; docs/guide/reports.md)",
            ["cause"],
            registry=r,
        )

    def on_event(self, record: dict[str, Any]) -> None:
        kind = Event(record).name
        if kind == "generation":
            self.generation.set(record["generation"])
            self.world.set(record["world_size"])
        elif kind == "fault":
            self.faults.labels(kind=record["kind"]).inc()
        elif kind == "recovered":
            self.recovery.observe(record["seconds"])
            self.steps_lost.inc(record.get("steps_lost") or 0)
        elif kind == "resize" and record.get("seconds") is not None:
            self.resize.labels(why=record["why"]).observe(record["seconds"])
        elif kind == "checkpoint-saved" and record.get("seconds") is not None:
            self.tier_save.labels(tier=record.get("tier", "?")).observe(record["seconds"])
        elif kind == "protection":
            self.protect_every.set(record["every"])
            self.steps_at_risk.set(record["steps_at_risk"])
        elif kind == "straggler":
            self.stragglers.inc()
        elif kind == "requeue":
            self.requeues.labels(cause=record.get("cause", "fault")).inc()
        elif kind in ("finished", "failed"):
            self.running.set(0)
            if record.get("goodput") is not None:
                self.goodput.set(record["goodput"])
            for cause, seconds in (record.get("goodput_by_cause") or {}).items():
                self.by_cause.labels(cause=cause).set(seconds)

    def on_scores(self, scores: dict[int, float]) -> None:
        for rank, score in scores.items():
            self.straggler_score.labels(rank=str(rank)).set(round(score, 3))

    def on_step_records(self, blocked_s: Iterable[float]) -> None:
        """Each rank's step as the supervisor read it: its commit blocking."""
        for seconds in blocked_s:
            self.blocked.observe(seconds)

    def on_step(self, step: int) -> None:
        now = self.clock()
        self.step.set(step)
        self._steps = [(t, s) for t, s in self._steps if now - t <= RATE_WINDOW_S] + [(now, step)]
        (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
        if t1 > t0:
            self.steps_per_s.set(max(0, s1 - s0) / (t1 - t0))

    def text(self) -> bytes:
        return generate_latest(self.registry)


def start(port: int | None, addr: str, textfile: Path | None, events: EventLog) -> MetricsOutput | None:
    """Metrics fed by ``events`` (and :meth:`MetricsOutput.update`), where the options say; None if
    nowhere."""
    if port is None and textfile is None:
        return None
    output = MetricsOutput(RunMetrics(), port, addr, textfile)
    events.listeners.append(output.metrics.on_event)
    return output


class MetricsOutput:
    """Where the metrics go: an HTTP endpoint, a textfile, or both; :meth:`update` once a second."""

    def __init__(self, metrics: RunMetrics, port: int | None, addr: str, textfile: Path | None) -> None:
        self.metrics, self.textfile, self._addr = metrics, textfile, addr
        self._server = None
        self.port: int | None = None
        self._write_failed = False
        if port is not None:
            try:
                self._server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
            except OSError as err:
                raise ConfigError(f"--metrics-port {port} on {addr}: {err.strerror or err}") from None
            self.port = self._server.server_port
        if textfile is not None:
            try:  # written once now: a path that cannot be written is refused before training
                textfile.parent.mkdir(parents=True, exist_ok=True)
                write_to_textfile(str(textfile), metrics.registry)
            except OSError as err:
                self._stop_server()
                raise ConfigError(f"--metrics-textfile {textfile}: {err.strerror or err}") from None

    def where(self) -> dict[str, Any]:
        """Fields of the ``metrics`` event: where to scrape or read them."""
        return {
            "port": self.port,
            "url": f"http://{self._addr}:{self.port}/metrics" if self.port else None,
            "textfile": str(self.textfile) if self.textfile is not None else None,
        }

    def steps(self, blocked_s: Iterable[float]) -> None:
        self.metrics.on_step_records(blocked_s)

    def update(self, step: int | None, scores: dict[int, float] | None = None) -> None:
        if step is not None and step >= 0:
            self.metrics.on_step(step)
        if scores:
            self.metrics.on_scores(scores)
        if self.textfile is not None:
            try:
                write_to_textfile(str(self.textfile), self.metrics.registry)  # a temporary file, then rename
            except OSError as err:  # a full disk mid-run: the metrics go stale, training does not stop
                if not self._write_failed:
                    log.warning("--metrics-textfile %s: cannot be written (%s); retried", self.textfile, err)
                self._write_failed = True
            else:
                self._write_failed = False

    def close(self) -> None:
        self.update(None)
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
