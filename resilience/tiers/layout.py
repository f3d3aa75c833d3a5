"""Where each tier keeps a job's files, the tiers' configuration, and their cleanup.

Three tiers, cheapest first (see ../ARCHITECTURE.md):

- RAM: ``$SRES_RAM_ROOT/job-J/node-N/own/`` (default root ``/dev/shm/sres-<uid>``, the
  user's alone: :func:`ram_root`; N is a ``NodeKey``: the Slurm node name, or a simulated
  node's index): the committed state of each rank of node N, outliving its processes;
- neighbour: ``job-J/node-M/neighbour/``: a copy of node N's files on the next node M, sent
  over the network, so that a replaced node restores from it;
- persistent: a directory on a shared filesystem, written every K commits.

Each tier root holds ``step-S/rank-R/`` checkpoints (:mod:`resilience.tiers.manifest`). The
prolog/epilog hooks and the ranks agree on the locations without talking; ``job_cleanup``
is what the epilog calls at job end. The save pipeline is :mod:`resilience.tiers.saver`, the
restore :mod:`resilience.tiers.restore`, the DCP adapters :mod:`resilience.tiers.dcp`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from resilience.contract import run_secret
from resilience.contract.tier_config import TierConfig, check_job_id
from resilience.private_paths import NotPrivate, private_dir
from resilience.tiers import checkpoint_dirs as dirs

log = logging.getLogger("resilience")

RAM_ROOT_ENV = "SRES_RAM_ROOT"
DEFAULT_RAM_ROOT = "/dev/shm/sres-{uid}"
"""``{uid}`` is the user's uid: each user has a root of their own (see :func:`ram_root`)."""
JOB_CONFIG = "tiers.json"
"""Written into the job's RAM directory: tells ``job_cleanup`` where the persistent copy is."""


def default_job_id(env: Mapping[str, str], log_dir: Path) -> str:
    """SLURM_JOB_ID when there is one (a requeued job keeps it), else a stable id of the run's
    log directory, so that a second ``sres run`` with the same ``--log-dir`` is the same job."""
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    return "run-" + hashlib.sha256(str(Path(log_dir).resolve()).encode()).hexdigest()[:12]


# --- locations -----------------------------------------------------------------------------------


def ram_root_of(uid: int, configured: str | None = None) -> Path:
    """Where user ``uid``'s RAM root is (``$SRES_RAM_ROOT`` or the default, ``{uid}``
    filled in); neither created nor checked: what the epilog looks for, as the job's user."""
    template = configured or os.environ.get(RAM_ROOT_ENV) or DEFAULT_RAM_ROOT
    return Path(template.replace("{uid}", str(uid)))


def ram_root(secret: str | None = None) -> Path:
    """This user's RAM root, created mode 0700 or adopted only when it is the user's own
    directory (:mod:`resilience.private_paths`). When it is not (another user made it first,
    or made it a link), a warning line names it and the run keeps its RAM tier in a private
    place of its own: ``<root>-<a name derived from the run's secret>``, the same for every
    rank of the run and one no one else can guess, so planting it in advance stops no one.
    ``secret``: the run's (a rank reads it from its environment; the supervisor, which has no
    such variable, passes it, or it cleaned another directory than its ranks had used)."""
    secret = os.environ.get(run_secret.ENV, "") if secret is None else secret
    return _private_root(str(ram_root_of(os.geteuid())), secret)


@functools.lru_cache(maxsize=8)
def _private_root(configured: str, secret: str) -> Path:
    path = Path(configured)
    try:
        return private_dir(path)
    except NotPrivate as err:
        if run_secret.is_secret(secret):
            suffix = run_secret.proof(secret, "ram-root")[:16]
        else:
            suffix = secrets.token_hex(8)  # outside a run: this process's alone
        fallback = path.with_name(f"{path.name}-{suffix}")
        print(
            f"sres: warning: {err}: not used for the RAM tier; it is kept in {fallback}, a private place",
            file=sys.stderr,
            flush=True,
        )
        return private_dir(fallback)


def job_ram_dir(job_id: str, root: Path | None = None) -> Path:
    """The RAM-tier directory of one job on this node."""
    check_job_id(job_id)
    return (root or ram_root()) / f"job-{job_id}"


NodeKey = int | str
"""Names a node's part of the RAM tier: the Slurm node name under Slurm (``SRES_NODE_NAME``,
so that a requeued job finds a host's copies whatever index the host has in the new
allocation), the node index for the simulated nodes of a local run."""


def node_dir(job_id: str, node: NodeKey, root: Path | None = None) -> Path:
    """One node's part of the RAM tier: wiping it is losing that node's memory."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(node)) or str(node) in (".", ".."):
        raise ValueError(f"not a node name: {node!r}")
    return job_ram_dir(job_id, root) / f"node-{node}"


def own_root(job_id: str, node: NodeKey, root: Path | None = None) -> Path:
    return node_dir(job_id, node, root) / "own"


def neighbour_root(job_id: str, node: NodeKey, root: Path | None = None) -> Path:
    return node_dir(job_id, node, root) / "neighbour"


def neighbour_node(node: int, nodes: list[int]) -> int | None:
    """The node that keeps the copy of ``node``'s RAM tier: the next one in the plan (so no node
    holds both copies). None when the job has a single node. Pure."""
    ordered = sorted(set(nodes))
    if len(ordered) < 2 or node not in ordered:
        return None
    return ordered[(ordered.index(node) + 1) % len(ordered)]


def record_job_config(config: TierConfig, root: Path | None = None) -> None:
    """Note the persistent directory in the job's RAM dir, for ``job_cleanup``. A RAM filesystem
    that refuses (full: any user can fill a shared ``/dev/shm``) once ended every rank at its
    start; now it is a warning, the RAM tier's saves fail and say so, and training goes on (the
    epilog then keeps what it cannot judge)."""
    path = job_ram_dir(config.job_id, root)
    tmp = path / f".{JOB_CONFIG}.{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        tmp.write_text(config.to_json())
        os.rename(tmp, path / JOB_CONFIG)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        log.warning("cannot note the job's tier settings in %s: %s", path, err)


# --- listing and retention ------------------------------------------------------------------------


def complete_steps(root: Path, job_id: str | None = None) -> dict[int, int]:
    """step -> world size of every checkpoint under ``root`` whose manifests exist for all its
    ranks, all written by one generation (a cheap check: manifests and file sizes, not
    checksums), newest first."""
    return complete_steps_of(root, dirs.steps_in(root), job_id)


def complete_steps_of(root: Path, steps: list[int], job_id: str | None = None) -> dict[int, int]:
    """:func:`complete_steps` among ``steps`` only."""
    out: dict[int, int] = {}
    for step in steps:
        ranks = dirs.ranks_in(root, step)
        try:
            manifests = [dirs.read_manifest(dirs.rank_dir(root, step, r), job_id) for r in ranks]
        except dirs.CheckpointInvalid:
            continue
        if (
            manifests
            and sorted(m.rank for m in manifests) == list(range(manifests[0].world_size))
            and all(m.world_size == manifests[0].world_size and m.step == step for m in manifests)
            and len({m.generation for m in manifests}) == 1
        ):
            out[step] = manifests[0].world_size
    return out


def prune(
    root: Path, keep: int, pinned: set[int] = frozenset(), owner: int | None = None, job_id: str | None = None
) -> None:
    """Remove the steps under ``root`` older than the newest ``keep`` complete ones (only rank
    ``owner``'s part when given); never a pinned step (one another tier is still reading).

    Counting complete copies, not directories: a newer step whose write failed or is still
    going on must not push out the only good copy. With fewer than ``keep`` complete copies
    nothing old is removed. Whole steps (no ``owner``) are complete when every rank's copy is,
    and an incomplete step older than the newest complete one is dead (every rank has written
    a newer step, and a rank writes its steps in order), so it goes too. With ``job_id``, only
    that job's copies count and only steps holding no other job's copy are removed (several
    jobs may share a persistent directory).
    """
    steps = dirs.steps_in(root)
    if owner is not None:
        steps = [s for s in steps if dirs.rank_dir(root, s, owner).exists()]
    complete = [s for s in steps if _complete(root, s, owner, job_id)]
    if keep < 1 or not complete:
        return
    oldest_kept = complete[keep - 1] if len(complete) >= keep else -1
    for step in steps:
        dead = owner is None and step < complete[0] and step not in complete
        if not (step < oldest_kept or dead) or step in pinned or _another_jobs(root, step, owner, job_id):
            continue
        target = dirs.rank_dir(root, step, owner) if owner is not None else dirs.step_dir(root, step)
        shutil.rmtree(target, ignore_errors=True)
        try:
            dirs.step_dir(root, step).rmdir()  # gone when its last rank left
        except OSError:
            pass


def _complete(root: Path, step: int, owner: int | None, job_id: str | None) -> bool:
    """Rank ``owner``'s copy has a valid manifest, or (no owner) every rank's has."""
    if owner is None:
        return step in complete_steps_of(root, [step], job_id)
    try:
        dirs.read_manifest(dirs.rank_dir(root, step, owner), job_id)
        return True
    except dirs.CheckpointInvalid:
        return False


def _another_jobs(root: Path, step: int, owner: int | None, job_id: str | None) -> bool:
    """Whether ``step`` (rank ``owner``'s part) holds a copy that names a job other than ``job_id``."""
    if job_id is None:
        return False
    for rank in [owner] if owner is not None else dirs.ranks_in(root, step):
        try:
            if dirs.read_manifest(dirs.rank_dir(root, step, rank)).job_id != job_id:
                return True
        except dirs.CheckpointInvalid:
            continue
    return False


def remove_job(job_id: str, root: Path | None = None) -> None:
    """Remove all of a job's RAM-tier files here: its training finished, nothing will restart."""
    shutil.rmtree(job_ram_dir(job_id, root), ignore_errors=True)
