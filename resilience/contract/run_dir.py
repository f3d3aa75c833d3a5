"""The run's log dir: every file a run leaves there, named once (:class:`RunDir`).

The supervisor, the placement, the ranks, the control client and the readers (``sres report``,
``sres chaos``, ``job.events()``) all reach the same files; each asks :class:`RunDir` for the
path instead of spelling the name. :attr:`RunDir.FILES` lists them with what each holds, the
same list as docs/reference/run-directory.md's table (tests/unit/test_run_dir.py holds them
together). Standard library only: the Slurm client and the admins' hooks may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

EVENTS = "events.jsonl"
STEP_TIMES = "step_times.jsonl"
RANKS_DIR = "ranks"
FAULT_SCHEDULE = "fault-schedule.json"
CONTROL_ADDRESS = "control.json"
CONTROL_TOKEN = "control.token"
SECRET = "run.secret"
SAMPLES_DIR = "samples"
REPORT_HTML = "report.html"
REPORT_PICTURES = ("timeline", "goodput", "ranks")
"""The report's pictures, each ``<page stem>-<kind>.png`` beside the page."""


@dataclass(frozen=True)
class RunDir:
    """One run's log dir (``--log-dir``): a path per file the run writes there."""

    path: Path

    FILES: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            EVENTS: "the supervisor's record of the run, one JSON object per event",
            STEP_TIMES: "the ranks' step times, one line per rank and step",
            f"{RANKS_DIR}/<slot>.log": "stdout and stderr of the process in that slot",
            FAULT_SCHEDULE: "a seeded fault schedule expanded into plain specs, so a seed replays",
            CONTROL_ADDRESS: "the supervisor's control port, while it runs",
            CONTROL_TOKEN: "the token every control request carries (0600)",
            SECRET: "the run's secret, kept for a requeued job (0600)",
            f"{SAMPLES_DIR}/rank-<R>.jsonl": "what each committed step of rank R trained on",
            "satellite-<job id>.out": "a satellite job's batch output",
            REPORT_HTML: "sres report's page",
            **{f"report-{kind}.png": f"sres report's {kind} picture" for kind in REPORT_PICTURES},
        }
    )
    """Every file of the log dir: its name (``<...>``: a part that varies) and what it holds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def events(self) -> Path:
        """Appended by the supervisor (launcher/observability/events.py): the run's timeline,
        which ``sres report``, ``simulate``, ``chaos``, ``demo`` and ``job.events()`` read."""
        return self.path / EVENTS

    @property
    def step_times(self) -> Path:
        """Appended by the supervisor (launcher/supervisor/observe/step_reports.py) as the ranks' step
        times arrive: stragglers, the checkpoint goodput cause, the report's heatmap."""
        return self.path / STEP_TIMES

    @property
    def ranks(self) -> Path:
        """The folder of the ranks' output files (:meth:`rank_log`)."""
        return self.path / RANKS_DIR

    def rank_log(self, slot: str) -> Path:
        """Appended by the placement (launcher/placement/processes.py): stdout and stderr of
        the process in ``slot`` (``n<node>p<local>``, ``r<k>``, ``n<node>s<k>``)."""
        return self.ranks / f"{slot}.log"

    @property
    def fault_schedule(self) -> Path:
        """Written by ``supervise()`` with ``--inject random:...``: the expanded schedule, so
        that a failing seed replays (``sres chaos`` reads it back)."""
        return self.path / FAULT_SCHEDULE

    @property
    def control_address(self) -> Path:
        """Written by the control server (launcher/supervisor/control.py) while the supervisor
        runs: the loopback address ``sres grow/shrink/resize/status`` connect to."""
        return self.path / CONTROL_ADDRESS

    @property
    def control_token(self) -> Path:
        """Written by the control server at start (0600): the token a control request carries,
        which only the run's user can read."""
        return self.path / CONTROL_TOKEN

    @property
    def secret(self) -> Path:
        """Written by ``supervise()`` at the first start (resilience/contract/run_secret.py,
        0600): the run's secret, kept so a requeued job finds what was named after it."""
        return self.path / SECRET

    @property
    def samples_dir(self) -> Path:
        """The folder of the ranks' sample records (:meth:`samples`)."""
        return self.path / SAMPLES_DIR

    def samples(self, rank: int) -> Path:
        """Appended by rank ``rank``'s ``ElasticSampler.record`` at each commit: what the
        committed step trained on, for ``resilience.elastic.coverage``."""
        return self.samples_dir / f"rank-{rank}.jsonl"

    def sample_files(self) -> list[Path]:
        """Every rank's :meth:`samples` file there is, in order of name."""
        return sorted(self.samples_dir.glob("rank-*.jsonl"))

    def satellite_output(self, job_id: str) -> Path:
        """Written by Slurm for a satellite job (launcher/slurm/satellites.py): its batch
        output. ``satellite_output("%j")`` is the pattern sbatch's ``--output`` takes."""
        return self.path / f"satellite-{job_id}.out"

    @property
    def report_html(self) -> Path:
        """Written by ``sres report`` (without ``--out``): the report page."""
        return self.path / REPORT_HTML

    @staticmethod
    def report_picture(page: Path, kind: str) -> Path:
        """Written by ``sres report`` beside its page (wherever ``--out`` puts it): the picture
        ``kind`` (one of :data:`REPORT_PICTURES`), named after the page's stem."""
        if kind not in REPORT_PICTURES:
            raise ValueError(f"{kind!r}: a report picture is one of {', '.join(REPORT_PICTURES)}")
        return page.with_name(f"{page.stem}-{kind}.png")
