"""Published training runs the goodput model is calibrated on: each input with its source.

A preset is a restart-based system whose goodput was published, with the failure counts and
the costs of its restarts as published, or derived from published figures where the paper is
silent (said so in the source). ``sres simulate --preset NAME`` runs the model on it and prints
the published figure beside the model's; the unit tests hold the model within the preset's
tolerance. Sources, in full, in docs/guide/reports.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.observability.goodput_model import FaultMix, SimulatedJob
from launcher.observability.goodput_strategies import Restart

LLAMA3 = "Llama 3 paper (Grattafiori et al. 2024, arXiv 2407.21783)"
BYTEROBUST = "ByteRobust (Wan et al., SOSP 2025, arXiv 2509.16293)"
MEGASCALE = "MegaScale (Jiang et al., NSDI 2024, arXiv 2402.15627)"


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    job: SimulatedJob
    """``work_hours`` is unused: a preset's run lasts ``days`` of wall time (see :meth:`work_hours`)."""
    days: float
    mix: FaultMix
    baseline: Restart
    published: float
    """The published goodput (effective training time ratio) of the restart-based run."""
    tolerance: tuple[float, float]
    """The model's goodput must fall in [low, high]: a published lower bound gives low = it."""
    sources: tuple[tuple[str, str], ...]
    """(input, where it comes from) for every input."""


PRESETS: dict[str, Preset] = {
    "llama3": Preset(
        name="llama3",
        title="Llama 3 405B pre-training, a 54-day snapshot on 16,384 H100 GPUs",
        job=SimulatedJob(
            gpus=16384,
            gpus_per_node=8,
            failures_per_node_hour=419 / (54 * 24 * 2048),
            planned_per_day=47 / 54,
        ),
        days=54.0,
        mix=FaultMix(process=56 / 419, hang=7 / 419, node=321 / 419, correlated=35 / 419, correlated_nodes=2),
        baseline=Restart(restart_s=441.0, detect_s=60.0, hang_timeout_s=600.0, ckpt_write_s=5.0),
        published=0.90,
        tolerance=(0.90, 0.95),
        sources=(
            ("16,384 GPUs, 8 per server", f"{LLAMA3}, 3.3.1"),
            ("419 unexpected and 47 planned interruptions in 54 days", f"{LLAMA3}, 3.3.4"),
            (
                "fault mix: software bug + dependency 56 in-process, NCCL watchdog 7 hang, network "
                "switch/cable 35 on 2 nodes, the other 321 one node",
                f"{LLAMA3}, Table 5; one top-of-rack switch per 2-server rack, 3.3.1",
            ),
            ("published: 'higher than 90% effective training time' (a lower bound)", f"{LLAMA3}, 3.3.4"),
            ("detection 60 s", f"{BYTEROBUST}, 2.2: explicit failures are detected in around 60 s"),
            ("hang detection 600 s", "PyTorch's default NCCL timeout (10 min); ByteRobust Table 3"),
            (
                "restart 441 s = rescheduling 379 s + start-up 30 s + checkpoint load 32 s",
                f"rescheduling: {BYTEROBUST}, Table 7 (requeue 768 s at 16,384 GPUs) and 8.2 (warm "
                "standby 10.87x faster than requeue and 5.36x than rescheduling: 768 x 5.36 / 10.87); "
                f"start-up: {MEGASCALE}, 3.5 (under 30 s beyond 10,000 GPUs); load: at most 4 GB per "
                f"GPU at the storage's sustained 2 TB/s ({LLAMA3}, 3.3.1): 16,384 x 4 GB / 2 TB/s",
            ),
            (
                "blocking checkpoint write 5 s, at Daly's optimal interval",
                f"{MEGASCALE}, 4.4: the copy to host memory takes several seconds, the write is asynchronous",
            ),
        ),
    ),
    "bytedance": Preset(
        name="bytedance",
        title="ByteRobust: a three-month dense-model job on 9,600 Hopper GPUs",
        job=SimulatedJob(gpus=9600, gpus_per_node=8, failures_per_node_hour=175 / (90 * 24 * 1200)),
        days=90.0,
        mix=FaultMix(process=32 / 175, hang=0.0, node=143 / 175, correlated=0.0),
        baseline=Restart(
            restart_s=93.0, detect_s=570.0, hang_timeout_s=600.0, ckpt_write_s=0.09, interval_s=10.0
        ),
        published=0.97,
        tolerance=(0.955, 0.985),
        sources=(
            ("9,600 GPUs (1,200 machines of 8), three months", f"{BYTEROBUST}, abstract and 8.1"),
            (
                "175 incidents: 128 evictions and restarts were 73.1%",
                f"{BYTEROBUST}, Table 4 (dense job): 128 / 0.731",
            ),
            (
                "fault mix: hot updates and rollbacks (20 + 12) in-process, evictions (128 + 15) one node",
                f"{BYTEROBUST}, Table 4",
            ),
            ("published: 97% ETTR", f"{BYTEROBUST}, abstract and 8.1.3"),
            (
                "detection 570 s = detection 60 s + localisation 8.5 min (2 to 15 min)",
                f"{BYTEROBUST}, 2.2",
            ),
            ("restart 93 s after localisation", f"{BYTEROBUST}, Table 6 (CUDA errors, the largest class)"),
            (
                "a checkpoint every step, 0.9% overhead (step time not published: 10 s assumed)",
                f"{BYTEROBUST}, 1 and Table 8",
            ),
        ),
    ),
}


def preset_work_hours(preset: Preset, goodput: float) -> float:
    """Work that fills the preset's ``days`` of wall time at this goodput: the published
    failure counts are per wall-clock period."""
    return preset.days * 24 * goodput
