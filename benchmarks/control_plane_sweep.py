"""A sweep of the control-plane harness over several sizes, this tree against an earlier commit
interleaved (each run a process of its own), as a table; and the curve ``sres simulate`` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "control_plane.py"
COLUMNS = (
    ("detect_s", "detect"),
    ("notified_s", "notified"),
    ("released_s", "released"),
    ("barrier_s", "barrier"),
    ("steady_supervisor_cpu", "sup. CPU"),
    ("steady_store_rps", "store req/s"),
    ("recovery_stubs_cpu_s", "stubs CPU s"),
)
TIMEOUT_S = 900


def run(ranks: int, code: Path | None) -> dict[str, Any]:
    """One harness run in a process of its own (``code``: another tree's ``launcher``/``resilience``)."""
    env = {**os.environ, **({"SRES_CODE": str(code)} if code is not None else {})}
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--ranks", str(ranks), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"ranks": ranks, "ok": False, "problems": [f"did not finish in {TIMEOUT_S} s"]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ranks": ranks, "ok": False, "problems": [f"no result (exit {done.returncode})"]}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(
        f"# {'base' if code else 'this tree'} at {ranks} ranks: {'ok' if result['ok'] else 'FAILED'}",
        file=sys.stderr,
    )
    return result


def sweep(sizes: Sequence[int], base: Path | None) -> list[tuple[int, dict[str, Any], dict[str, Any] | None]]:
    rows = []
    for ranks in sizes:
        ours = run(ranks, None)
        theirs = run(ranks, base) if base is not None else None
        rows.append((ranks, ours, theirs))
    return rows


def cell(result: dict[str, Any] | None, key: str) -> str:
    if result is None:
        return "-"
    value = result.get(key)
    return "-" if value is None else f"{value:g}"


def table(rows: list[tuple[int, dict[str, Any], dict[str, Any] | None]], base: str | None) -> str:
    head = ["ranks", "tree", "run"] + [name for _, name in COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ranks, ours, theirs in rows:
        for label, result in (("this", ours), (base or "", theirs)):
            if result is not None:
                verdict = "ok" if result.get("ok") else "failed"
                cells = [str(ranks), label, verdict] + [cell(result, k) for k, _ in COLUMNS]
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def problems(rows: list[tuple[int, dict[str, Any], dict[str, Any] | None]]) -> list[str]:
    out = []
    for ranks, ours, theirs in rows:
        for label, result in (("this tree", ours), ("base", theirs)):
            if result is not None and not result.get("ok"):
                out.append(
                    f"{label} at {ranks}: {'; '.join(str(p)[:300] for p in result.get('problems', []))}"
                )
    return out


def curve(rows: list[tuple[int, dict[str, Any], dict[str, Any] | None]], machine: str) -> dict[str, Any]:
    """The points ``sres simulate`` fits (this tree's runs that finished)."""
    points = [
        {k: ours[k] for k in ("ranks", "nodes", "detect_s", "released_s", "barrier_s")}
        for _, ours, _ in rows
        if ours.get("ok") and ours.get("released_s") is not None
    ]
    return {
        "machine": machine,
        "command": "python benchmarks/control_plane.py --sweep "
        + ",".join(str(r) for r, _, _ in rows)
        + " --write-curve launcher/observability/control_plane_curve.json",
        "measured": time.strftime("%Y-%m-%d"),
        "points": sorted(points, key=lambda p: p["ranks"]),
    }


def plot(rows: list[tuple[int, dict[str, Any], dict[str, Any] | None]], base: str | None, path: Path) -> None:
    """The curves: the control path's parts, the steady store load and the supervisor's steady
    CPU, by ranks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    steady = (
        (middle, "steady_store_rps", 1.0, "store requests/s"),
        (right, "steady_supervisor_cpu", 100.0, "CPU %"),
    )
    for which, style in (("this", "-o"), ("base", "--s")):
        results = [(r, (o if which == "this" else b)) for r, o, b in rows]
        label = "this tree" if which == "this" else (base or "base")
        for key, _ in COLUMNS[:4]:
            points = [(r, x[key]) for r, x in results if x is not None and x.get(key) is not None]
            if points:
                left.plot(*zip(*points), style, label=f"{key} ({label})")
        for axis, key, scale, what in steady:
            points = [(r, x[key] * scale) for r, x in results if x is not None and key in x]
            if points:
                axis.plot(*zip(*points), style, label=f"{what} ({label})")
    titles = (
        "a node fault's control path (s)",
        "steady store requests a second",
        "steady supervisor CPU (% of a core)",
    )
    for axis, title in zip((left, middle, right), titles):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("ranks")
        axis.set_title(title)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
