"""A governance policy as data: teams with quotas and weights, priority classes, the grace time.

Everything that can be checked without Slurm is checked when the file is read, and each problem
is one line naming where it is (``teams.vision.quota_nodes: ...``): an admin fixes a policy
before anything in the accounting database changes. Names are what Slurm will call the
objects, so they must be names Slurm keeps as written (``sacctmgr`` lowercases account names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import PolicyError
from resilience.contract import settings_yaml

NAME = re.compile(r"^[a-z][a-z0-9_-]{0,29}$")
"""Account and QOS names Slurm keeps as written: lower case, short."""
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
BORROW = "borrow"
"""The QOS of work on capacity its team does not own: low priority, taken back first."""
BORROW_SUFFIX = "_borrow"
"""A borrowing team's second account: its borrowed work is accounted apart from its quota."""
RESERVED = frozenset({BORROW, "normal", "root"})
PREEMPT_MODES = ("requeue", "cancel")
MAX_PRIORITY = 1_000_000


@dataclass(frozen=True)
class PriorityClass:
    """A QOS: its priority, whether its jobs take borrowed nodes back, which classes it preempts."""

    name: str
    priority: int
    preempts_borrowed: bool = True
    preempts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Team:
    """A Slurm account: what it owns (its quota), its fair-share weight, lending and borrowing."""

    name: str
    quota_nodes: int
    weight: int = 1
    lend: bool = True
    borrow: bool = True
    quota_gpus: int | None = None
    users: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    """The priority classes its jobs may ask for; empty: every class."""
    default_class: str | None = None
    """The class of a job that asks for none; None: the team's lowest."""


@dataclass(frozen=True)
class Policy:
    teams: tuple[Team, ...]
    priority_classes: tuple[PriorityClass, ...]
    grace_time_s: int = 120
    """How long a borrowed job has, once its nodes are claimed, to checkpoint and leave."""
    preempt_mode: str = "requeue"
    """What Slurm does with a borrowed job whose nodes are taken back: requeue or cancel."""
    cluster: str | None = None
    """The cluster's name in the accounting database; None: slurm.conf's ClusterName."""
    cluster_nodes: int | None = None
    """Nodes the quotas share; None: every node Slurm knows."""
    cluster_gpus: int | None = None

    def team_classes(self, team: Team) -> tuple[str, ...]:
        """The classes ``team`` may use, highest priority first."""
        names = team.classes or tuple(c.name for c in self.priority_classes)
        return tuple(c.name for c in self.by_priority() if c.name in names)

    def default_class(self, team: Team) -> str:
        return team.default_class or self.team_classes(team)[-1]

    def by_priority(self) -> tuple[PriorityClass, ...]:
        return tuple(sorted(self.priority_classes, key=lambda c: (-c.priority, c.name)))

    def lendable_nodes(self, total: int) -> int:
        """Nodes borrowed work may hold at once: all but the quotas of teams that do not lend."""
        return total - sum(t.quota_nodes for t in self.teams if not t.lend)


def load(path: Path) -> Policy:
    """The policy in ``path``, validated; :class:`PolicyError` in one line otherwise."""
    try:
        data = settings_yaml.load_file(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PolicyError(f"cannot read the policy {path}: {first}") from None
    return from_data(data)


def from_data(data: Any) -> Policy:
    top = _fields(data, "policy", REQUIRED_TOP, OPTIONAL_TOP)
    classes = tuple(
        _priority_class(name, spec) for name, spec in _named(top["priority_classes"], "priority_classes")
    )
    teams = tuple(_team(name, spec) for name, spec in _named(top["teams"], "teams"))
    policy = Policy(
        teams=teams,
        priority_classes=classes,
        grace_time_s=_int(top.get("grace_time_s", 120), "grace_time_s", 0, 86_400),
        preempt_mode=_choice(top.get("preempt_mode", "requeue"), "preempt_mode", PREEMPT_MODES),
        cluster=_optional_name(top.get("cluster"), "cluster"),
        cluster_nodes=_optional_int(top.get("cluster_nodes"), "cluster_nodes", 1),
        cluster_gpus=_optional_int(top.get("cluster_gpus"), "cluster_gpus", 0),
    )
    validate(policy)
    return policy


REQUIRED_TOP = ("teams", "priority_classes")
OPTIONAL_TOP = ("grace_time_s", "preempt_mode", "cluster", "cluster_nodes", "cluster_gpus")
TEAM_FIELDS = ("weight", "lend", "borrow", "quota_gpus", "users", "classes", "default_class")
CLASS_FIELDS = ("preempts_borrowed", "preempts")


def _priority_class(name: str, spec: Any) -> PriorityClass:
    where = f"priority_classes.{name}"
    f = _fields(spec, where, ("priority",), CLASS_FIELDS)
    return PriorityClass(
        name=name,
        priority=_int(f["priority"], f"{where}.priority", 0, MAX_PRIORITY),
        preempts_borrowed=_bool(f.get("preempts_borrowed", True), f"{where}.preempts_borrowed"),
        preempts=_names(f.get("preempts", []), f"{where}.preempts"),
    )


def _team(name: str, spec: Any) -> Team:
    where = f"teams.{name}"
    f = _fields(spec, where, ("quota_nodes",), TEAM_FIELDS)
    users = f.get("users", [])
    if not isinstance(users, list) or not all(isinstance(u, str) and USER.match(u) for u in users):
        raise PolicyError(f"{where}.users: a list of user names (lower case, as on the nodes)")
    default = f.get("default_class")
    return Team(
        name=name,
        quota_nodes=_int(f["quota_nodes"], f"{where}.quota_nodes", 0, 1_000_000),
        weight=_int(f.get("weight", 1), f"{where}.weight", 1, 1_000_000),
        lend=_bool(f.get("lend", True), f"{where}.lend"),
        borrow=_bool(f.get("borrow", True), f"{where}.borrow"),
        quota_gpus=_optional_int(f.get("quota_gpus"), f"{where}.quota_gpus", 0),
        users=tuple(dict.fromkeys(users)),
        classes=_names(f.get("classes", []), f"{where}.classes"),
        default_class=None if default is None else _name(default, f"{where}.default_class"),
    )


def validate(policy: Policy) -> None:
    """Refuse, in one line, what no cluster could apply: unknown names, cycles, reused names."""
    classes = {c.name for c in policy.priority_classes}
    if not policy.teams or not classes:
        raise PolicyError("policy: at least one team and one priority class are needed")
    for team in policy.teams:
        where = f"teams.{team.name}"
        if team.name.endswith(BORROW_SUFFIX):
            raise PolicyError(f"{where}: names ending in {BORROW_SUFFIX!r} are the borrowing accounts' own")
        for name in (*team.classes, *([team.default_class] if team.default_class else [])):
            if name not in classes:
                raise PolicyError(
                    f"{where}: unknown priority class {name!r} (classes: {', '.join(sorted(classes))})"
                )
        if team.default_class and team.classes and team.default_class not in team.classes:
            raise PolicyError(f"{where}.default_class: {team.default_class!r} is not one of its classes")
        if team.quota_gpus is not None and policy.cluster_gpus is None:
            raise PolicyError(f"{where}.quota_gpus: GPU quotas need cluster_gpus, the GPUs they share")
    for pc in policy.priority_classes:
        for name in pc.preempts:
            if name not in classes:
                raise PolicyError(f"priority_classes.{pc.name}.preempts: unknown priority class {name!r}")
    cycle = preemption_cycle(policy.priority_classes)
    if cycle:
        raise PolicyError(f"priority_classes: they preempt each other in a cycle: {' -> '.join(cycle)}")
    if policy.cluster_nodes is not None:
        check_capacity(policy, policy.cluster_nodes, policy.cluster_gpus)


def check_capacity(policy: Policy, nodes: int, gpus: int | None) -> None:
    """Quotas must fit the cluster: a quota nobody can be given is no guarantee."""
    promised = sum(t.quota_nodes for t in policy.teams)
    if promised > nodes:
        raise PolicyError(f"teams: quotas add up to {promised} nodes; the cluster has {nodes}")
    promised_gpus = sum(t.quota_gpus or 0 for t in policy.teams)
    if gpus is not None and promised_gpus > gpus:
        raise PolicyError(f"teams: GPU quotas add up to {promised_gpus}; the cluster has {gpus}")


def preemption_cycle(classes: tuple[PriorityClass, ...]) -> list[str]:
    """A cycle of ``preempts`` (first name repeated at the end), or [] when there is none."""
    edges = {c.name: c.preempts for c in classes}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for nxt in edges.get(name, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(edges):
        if name not in state and (found := visit(name)):
            return found
    return []


# --- reading values, each error one line ---------------------------------------------------


def _fields(data: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: a mapping of {', '.join(required + optional)}")
    unknown = sorted(set(map(str, data)) - set(required) - set(optional))
    if unknown:
        raise PolicyError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(required + optional)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise PolicyError(f"{where}: {missing[0]} is missing")
    return data


def _named(data: Any, where: str) -> list[tuple[str, Any]]:
    if not isinstance(data, dict) or not data:
        raise PolicyError(f"{where}: a mapping from names to their settings, not empty")
    seen: set[str] = set()
    out = []
    for name, spec in data.items():
        checked = _name(name, where)
        if checked in RESERVED:
            raise PolicyError(f"{where}.{checked}: {checked!r} is Slurm's or sres's own name; pick another")
        if checked in seen:
            raise PolicyError(f"{where}.{checked}: given twice")
        seen.add(checked)
        out.append((checked, spec))
    return out


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise PolicyError(
            f"{where}: {str(value)[:40]!r} is not a name Slurm keeps (a-z, 0-9, _ and -, 30 at most)"
        )
    return value


def _names(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{where}: a list of names")
    return tuple(dict.fromkeys(_name(v, where) for v in value))


def _optional_name(value: Any, where: str) -> str | None:
    return None if value is None else _name(value, where)


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PolicyError(f"{where}: a whole number from {low} to {high}, not {str(value)[:40]!r}")
    return value


def _optional_int(value: Any, where: str, low: int) -> int | None:
    return None if value is None else _int(value, where, low, 10_000_000)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: true or false, not {str(value)[:40]!r}")
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise PolicyError(f"{where}: one of {', '.join(choices)}, not {str(value)[:40]!r}")
    return str(value)


__all__ = ["Policy", "Team", "PriorityClass", "load", "from_data", "validate", "check_capacity"]
