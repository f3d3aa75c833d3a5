"""What a policy stands for in Slurm (pure): QOS, accounts, memberships and slurm.conf lines.

- A priority class is a QOS with its priority; one that takes borrowed nodes back preempts the
  ``borrow`` QOS (``PreemptType=preempt/qos``).
- A team is an account with its fair-share weight and ``GrpTRES=node=<quota>``: the work inside
  its quota. A team that borrows has a second account, ``<team>_borrow``, with the same weight
  and only the ``borrow`` QOS: borrowed work is counted apart, so borrowing never eats into the
  team's own quota, and idle nodes go to borrowers by fair share, that is by weight.
- ``borrow`` is low priority, preempted with the policy's grace time, and capped at the nodes
  teams lend: a team that does not lend keeps its quota's nodes free of borrowed work.

Objects this project made carry :data:`MARK` in their description; nothing else is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.governance.policy import BORROW, BORROW_SUFFIX, Policy, PriorityClass, Team
from launcher.slurm.accounting import QosRecord as Qos  # wanted as Slurm lists it

MARK = "sres-governance"
"""The description prefix of every QOS and account ``sres governance apply`` manages."""
ORGANIZATION = "sres"


@dataclass(frozen=True)
class Account:
    name: str
    description: str
    fairshare: int
    qos: tuple[str, ...]
    default_qos: str
    grp_tres: str = ""


@dataclass(frozen=True)
class Objects:
    """Accounting objects by name; ``members``: (user, account) pairs."""

    qos: dict[str, Qos]
    accounts: dict[str, Account]
    members: frozenset[tuple[str, str]]

    @classmethod
    def empty(cls) -> "Objects":
        return cls({}, {}, frozenset())


def desired(policy: Policy, nodes: int, gpus: int | None) -> Objects:
    """The objects ``policy`` stands for on a cluster of ``nodes`` nodes (and ``gpus`` GPUs)."""
    qos = {c.name: _class_qos(c) for c in policy.priority_classes}
    lendable = policy.lendable_nodes(nodes)
    lendable_gpus = (
        None if gpus is None else gpus - sum(t.quota_gpus or 0 for t in policy.teams if not t.lend)
    )
    qos[BORROW] = Qos(
        name=BORROW,
        description=f"{MARK}: work on borrowed capacity",
        priority=0,
        preempt_mode=policy.preempt_mode,
        grace_time_s=policy.grace_time_s,
        grp_tres=tres(lendable, lendable_gpus if _any_gpu_quota(policy) else None),
    )
    accounts: dict[str, Account] = {}
    members: set[tuple[str, str]] = set()
    for team in policy.teams:
        own = _team_account(policy, team)
        accounts[own.name] = own
        members |= {(user, own.name) for user in team.users}
        if team.borrow:
            name = team.name + BORROW_SUFFIX
            accounts[name] = Account(name, f"{MARK}: {team.name}, borrowed", team.weight, (BORROW,), BORROW)
            members |= {(user, name) for user in team.users}
    return Objects(qos, accounts, frozenset(members))


def _class_qos(c: PriorityClass) -> Qos:
    targets = (*((BORROW,) if c.preempts_borrowed else ()), *c.preempts)
    return Qos(c.name, f"{MARK}: priority class", c.priority, tuple(sorted(targets)))


def _team_account(policy: Policy, team: Team) -> Account:
    gpus = team.quota_gpus if _any_gpu_quota(policy) else None
    return Account(
        name=team.name,
        description=f"{MARK}: team {team.name}",
        fairshare=team.weight,
        qos=tuple(sorted(policy.team_classes(team))),
        default_qos=policy.default_class(team),
        grp_tres=tres(team.quota_nodes, gpus),
    )


def _any_gpu_quota(policy: Policy) -> bool:
    return any(t.quota_gpus is not None for t in policy.teams)


def tres(nodes: int, gpus: int | None) -> str:
    """``GrpTRES`` as Slurm prints it back (sorted)."""
    parts = [f"node={nodes}", *([f"gres/gpu={gpus}"] if gpus is not None else [])]
    return ",".join(sorted(parts))


def conf_lines(policy: Policy) -> dict[str, str]:
    """slurm.conf settings the objects need: QOS preemption, priorities from QOS and fair share,
    limits enforced (and GPUs counted, where quotas name them). A change of PreemptType or
    PriorityType needs slurmctld restarted; ``scontrol reconfigure`` does not apply it."""
    lines = {
        "AccountingStorageEnforce": "associations,limits,qos,safe",
        "PreemptType": "preempt/qos",
        "PreemptMode": policy.preempt_mode.upper(),
        "PriorityType": "priority/multifactor",
        "PriorityWeightQOS": "10000",
        "PriorityWeightFairShare": "1000",
        "JobRequeue": "1",
    }
    if _any_gpu_quota(policy):
        lines["AccountingStorageTRES"] = "gres/gpu"
    return lines


def conf_gaps(wanted: dict[str, str], running: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, wanted, running) for each setting the running controller does not have."""
    gaps, folded = [], {k.lower(): v for k, v in running.items()}  # keys: any case, as in slurm.conf
    for key, want in wanted.items():
        have = folded.get(key.lower(), "")
        if not _satisfied(key, want.strip().lower(), have.strip().lower()):
            gaps.append((key, want, have or "(not set)"))
    return gaps


def _satisfied(key: str, want: str, have: str) -> bool:
    if key in ("AccountingStorageEnforce", "AccountingStorageTRES"):  # lists: more is fine
        return set(want.split(",")) <= set(have.split(","))
    if key == "PreemptMode":  # scontrol adds flags: "REQUEUE,GANG"
        return have.split(",")[0] == want
    return have == want
