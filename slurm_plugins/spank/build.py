"""Build the ``srun --auto-resume`` SPANK plugin against the cluster's own ``spank.h``.

A SPANK plugin must match the Slurm it is loaded by, so it is compiled on (or for) the
cluster, from the header that libslurm-dev installs, never shipped as a binary. The command
prints the plugstack.conf line that installs it (``optional <.so> sres=<sres>``): srun reads
plugstack.conf itself, so no daemon restarts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from slurm_plugins.errors import HooksConfigError, SpankBuildError

SOURCE = Path(__file__).with_name("sres_auto_resume.c")
PLUGIN = "sres_auto_resume.so"


def build(out_dir: Path, cc: str = "cc", include: Path = Path("/usr/include")) -> Path:
    """Compile the plugin into ``out_dir``; returns the .so path."""
    if not (include / "slurm" / "spank.h").exists():
        raise HooksConfigError(
            f"{include}/slurm/spank.h not found: install Slurm's headers (apt-get install libslurm-dev)"
        )
    if shutil.which(cc) is None:
        raise HooksConfigError(f"C compiler {cc!r} not found (apt-get install gcc), or pass --cc")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / PLUGIN
    tmp = out_dir / f".{PLUGIN}.tmp"
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{include}", "-o", str(tmp), str(SOURCE)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SpankBuildError(f"building the SPANK plugin failed ({' '.join(cmd)}):\n{result.stderr.strip()}")
    tmp.replace(target)  # srun processes that already loaded the old file keep their mapping
    return target


def plugstack_line(plugin: Path, sres: str) -> str:
    """The line that installs the plugin: srun reads plugstack.conf itself, no daemon restart."""
    return f"optional {plugin} sres={sres}"


def add_parser(hooks) -> None:
    """``sres hooks build-spank``: registered under the ``hooks`` command group."""
    p = hooks.add_parser(
        "build-spank",
        help="build the srun --auto-resume SPANK plugin and print its plugstack.conf line",
        description="Compile slurm_plugins/spank/sres_auto_resume.c against this machine's "
        "/usr/include/slurm/spank.h (libslurm-dev) and print the plugstack.conf line "
        "that installs it (srun reads plugstack.conf itself: no daemon restart).",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("/usr/local/lib/sres"),
        help="where the .so goes (default /usr/local/lib/sres)",
    )
    p.add_argument("--cc", default="cc", help="C compiler (default cc)")
    p.add_argument("--sres", default=None, help="the sres command the plugin runs (default: this sres)")
    p.set_defaults(func=_cmd_build)


def _cmd_build(args) -> int:
    import sys

    plugin = build(args.out, args.cc)
    sres = args.sres or shutil.which("sres") or str(Path(sys.argv[0]).resolve())
    print(
        f"built {plugin}\nadd to plugstack.conf (the file PlugStackConfig= in slurm.conf names):\n"
        f"  {plugstack_line(plugin, sres)}"
    )
    return 0
