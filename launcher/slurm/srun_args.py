"""``sres srun`` / ``srun --auto-resume``: read srun's command line into a supervised run. Pure.

The options that shape the run (nodes, tasks per node) are ours to interpret; every other
option goes unchanged to each rank's step (``--gpus-per-task``, ``--cpu-bind``, ...). Spare
nodes default to the nodes the allocation holds beyond ``-N``: ``sbatch -N 4`` with
``srun --auto-resume=2 -N 3 python train.py`` trains on 3 nodes and keeps one warm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.errors import ConfigError

# srun options that take a value in the next argument when not written --opt=value.
_WITH_VALUE = {
    "-A",
    "--account",
    "-c",
    "--cpus-per-task",
    "-C",
    "--constraint",
    "-D",
    "--chdir",
    "-e",
    "--error",
    "-G",
    "--gpus",
    "-i",
    "--input",
    "-J",
    "--job-name",
    "-L",
    "--licenses",
    "-m",
    "--distribution",
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "-o",
    "--output",
    "-p",
    "--partition",
    "-q",
    "--qos",
    "-t",
    "--time",
    "-w",
    "--nodelist",
    "-x",
    "--exclude",
    "--gpus-per-node",
    "--gpus-per-task",
    "--cpus-per-gpu",
    "--mem",
    "--mem-per-cpu",
    "--mem-per-gpu",
    "--ntasks-per-node",
    "--cpu-bind",
    "--gpu-bind",
    "--export",
    "--mpi",
    "--network",
    "--signal",
    "--spares",
    "--auto-resume",
}
# Options of the whole job step that make no sense per rank: refused with a reason.
_REFUSED = {"-w": "--nodelist", "--nodelist": "--nodelist", "-r": "--relative", "--relative": "--relative"}


@dataclass(frozen=True)
class SrunRequest:
    command: tuple[str, ...]
    nodes: int | None  # None: every healthy node of the allocation minus the spares
    procs_per_node: int
    spares: int | None
    retries: int
    step_args: tuple[str, ...]
    partition: str | None = None


def parse(argv: Sequence[str]) -> SrunRequest:
    """Split ``[--auto-resume[=N]] [--spares S] [srun options] COMMAND...``."""
    options, command = _split(list(argv))
    if not command:
        raise ConfigError("no command given: sres srun --auto-resume=1 -N 2 python train.py")
    found: dict[str, int] = {}
    retries, partition, step = 1, None, []
    for name, value, eq, raw in options:
        if name == "--auto-resume":
            retries = _int(name, value) if eq else 1
        elif name in _COUNTS:
            found[_COUNTS[name]] = _int(name, value.split("-")[0] if name in ("-N", "--nodes") else value)
        else:
            partition = value if name in ("-p", "--partition") else partition
            step.extend(raw)
    if retries < 0:
        raise ConfigError(f"--auto-resume must be 0 or more (got {retries})")
    nodes, per_node = _layout(found.get("nodes"), found.get("ntasks"), found.get("per_node"))
    return SrunRequest(command, nodes, per_node, found.get("spares"), retries, tuple(step), partition)


_COUNTS = {
    "-N": "nodes",
    "--nodes": "nodes",
    "-n": "ntasks",
    "--ntasks": "ntasks",
    "--ntasks-per-node": "per_node",
    "--spares": "spares",
}


def _split(args: list[str]) -> tuple[list[tuple[str, str, str, list[str]]], tuple[str, ...]]:
    """The leading options as (name, value, '=' or '', the words as given), and the command after them."""
    options = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        start, arg = i, args[i]
        if arg == "--":
            i += 1
            break
        name, eq, value = arg.partition("=")
        if not name.startswith("--") and len(name) > 2:
            name, value, eq = name[:2], name[2:], "="  # -N3
        if name in _REFUSED:
            raise ConfigError(
                f"srun {_REFUSED[name]} cannot be used with auto-resume: sres places ranks itself "
                "(exclude nodes with sbatch instead)"
            )
        if name in _WITH_VALUE and not eq and name != "--auto-resume":
            if i + 1 >= len(args):
                raise ConfigError(f"srun option {name} needs a value")
            i += 1
            value = args[i]
        i += 1
        options.append((name, value, eq, args[start:i]))
    return options, tuple(args[i:])


def _layout(nodes: int | None, ntasks: int | None, per_node: int | None) -> tuple[int | None, int]:
    """Nodes and ranks per node from -N, -n and --ntasks-per-node: one rank layout per node."""
    if ntasks is not None:
        if per_node is None:
            if nodes is None or ntasks % nodes:
                raise ConfigError(
                    f"-n {ntasks} needs -N with a node count that divides it (one rank layout per node)"
                )
            per_node = ntasks // nodes
        elif nodes is None:
            nodes = ntasks // per_node
        if nodes * per_node != ntasks:
            raise ConfigError(f"-n {ntasks} is not -N {nodes} x --ntasks-per-node {per_node}")
    return nodes, per_node or 1


def split_ours(argv: Sequence[str], ours: dict[str, bool]) -> tuple[list[str], list[str]]:
    """Separate sres's own options (``ours``: name -> takes a value) from srun's and the command.

    Both may come in any order before the command; the command's own options are never looked at.
    """
    mine: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        name, eq, _ = argv[i].partition("=")
        short = name[:2] if not name.startswith("--") and len(name) > 2 else name
        if name in ours:
            take = 2 if ours[name] and not eq else 1
            mine.extend(argv[i : i + take])
            i += take
            continue
        take = 2 if short == name and name in _WITH_VALUE and not eq and name != "--auto-resume" else 1
        rest.extend(argv[i : i + take])
        i += take
    return mine, rest + list(argv[i:])


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"srun option {name}: {value!r} is not a whole number") from None
