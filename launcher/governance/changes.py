"""From the accounting objects there are to those a policy wants (pure): ``sacctmgr`` commands.

Only what differs is changed, so applying a policy twice runs nothing the second time; and the
same function undoes a refused apply (from what is there to what was there). The order keeps
every reference valid at every step: QOS are added before the QOS that preempt them and before
the accounts that use them, and removed only after nothing refers to them any more.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from launcher.errors import PolicyError
from launcher.governance.slurm_objects import ORGANIZATION, Account, Objects, Qos

Command = tuple[str, ...]
"""``sacctmgr -i`` arguments."""


@dataclass(frozen=True)
class Change:
    """One ``sacctmgr`` command and what it does, in words."""

    args: Command
    what: str

    def shell(self) -> str:
        return " ".join(["sacctmgr", "-i", *(_quoted(a) for a in self.args)])


def plan(
    current: Objects, wanted: Objects, cluster: str, foreign: frozenset[str] = frozenset()
) -> list[Change]:
    """The commands that make ``current`` (the objects this project manages) ``wanted``.
    ``foreign``: names of QOS and accounts that exist and are not ours; wanting one is refused,
    never taken over."""
    taken = sorted(foreign & (set(wanted.qos) | set(wanted.accounts)))
    if taken:
        raise PolicyError(
            f"{taken[0]!r} already exists in Slurm's accounting and was not made by sres: rename it "
            "in the policy, or remove it from Slurm first"
        )
    return [
        *_qos_added(current, wanted),
        *_qos_modified(current, wanted),
        *_accounts_added(current, wanted, cluster),
        *_accounts_modified(current, wanted, cluster),
        *(_member_added(u, a, cluster) for u, a in sorted(wanted.members - current.members)),
        *(_member_removed(u, a, cluster) for u, a in sorted(current.members - wanted.members)),
        *(
            Change(("delete", "account", f"name={n}", f"cluster={cluster}"), f"team account {n} goes")
            for n in sorted(set(current.accounts) - set(wanted.accounts))
        ),
        *(
            Change(("delete", "qos", f"name={n}"), f"QOS {n} goes")
            for n in sorted(set(current.qos) - set(wanted.qos))
        ),
    ]


def _qos_added(current: Objects, wanted: Objects) -> list[Change]:
    """New QOS, each after the QOS it preempts (the policy has no preemption cycle)."""
    pending = {n: q for n, q in wanted.qos.items() if n not in current.qos}
    out = []
    while pending:
        ready = sorted(n for n, q in pending.items() if not set(q.preempt) & (set(pending) - {n}))
        if not ready:
            raise PolicyError(f"QOS preempt each other in a cycle: {', '.join(sorted(pending))}")
        for name in ready:
            q = pending.pop(name)
            out.append(Change(("add", "qos", name, *_qos_settings(q, None)), f"QOS {name} is made"))
    return out


def _qos_modified(current: Objects, wanted: Objects) -> list[Change]:
    out = []
    for name in sorted(set(current.qos) & set(wanted.qos)):
        settings = _qos_settings(wanted.qos[name], current.qos[name])
        if settings:
            out.append(
                Change(("modify", "qos", "where", f"name={name}", "set", *settings), f"QOS {name} changes")
            )
    return out


def _qos_settings(q: Qos, old: Qos | None) -> list[str]:
    """``Key=value`` for each field of ``q`` that differs from ``old`` (every field: new)."""
    keys = {
        "description": "Description",
        "priority": "Priority",
        "preempt": "Preempt",
        "preempt_mode": "PreemptMode",
        "grace_time_s": "GraceTime",
        "grp_tres": "GrpTRES",
    }
    out = []
    for f in fields(Qos):
        if f.name == "name":
            continue
        new, was = getattr(q, f.name), (getattr(old, f.name) if old is not None else None)
        if old is not None and new == was:
            continue
        if old is None and new in ((), "", 0, "cluster") and f.name != "priority":
            continue  # Slurm's default already
        out.append(f"{keys[f.name]}={_value(f.name, new, was)}")
    return out


def _accounts_added(current: Objects, wanted: Objects, cluster: str) -> list[Change]:
    out = []
    for name in sorted(set(wanted.accounts) - set(current.accounts)):
        a = wanted.accounts[name]
        grp = [f"GrpTRES={a.grp_tres}"] if a.grp_tres else []
        args = (
            "add",
            "account",
            name,
            f"Cluster={cluster}",
            f"Description={a.description}",
            f"Organization={ORGANIZATION}",
            "Parent=root",
            f"Fairshare={a.fairshare}",
            f"QOS={','.join(a.qos)}",
            f"DefaultQOS={a.default_qos}",
            *grp,
        )
        out.append(Change(args, f"account {name} is made"))
    return out


def _accounts_modified(current: Objects, wanted: Objects, cluster: str) -> list[Change]:
    out = []
    for name in sorted(set(current.accounts) & set(wanted.accounts)):
        a, was = wanted.accounts[name], current.accounts[name]
        settings = _account_settings(a, was)
        if settings:
            where = ("where", f"name={name}", f"cluster={cluster}")
            out.append(Change(("modify", "account", *where, "set", *settings), f"account {name} changes"))
    return out


def _account_settings(a: Account, was: Account) -> list[str]:
    out = []
    if a.description != was.description:
        out.append(f"Description={a.description}")
    if a.fairshare != was.fairshare:
        out.append(f"Fairshare={a.fairshare}")
    if a.qos != was.qos or a.default_qos != was.default_qos:
        out += [f"QOS={','.join(a.qos)}", f"DefaultQOS={a.default_qos}"]
    if a.grp_tres != was.grp_tres:
        out.append(f"GrpTRES={_value('grp_tres', a.grp_tres, was.grp_tres)}")
    return out


def _member_added(user: str, account: str, cluster: str) -> Change:
    return Change(
        ("add", "user", user, f"Account={account}", f"Cluster={cluster}"), f"{user} joins {account}"
    )


def _member_removed(user: str, account: str, cluster: str) -> Change:
    return Change(
        ("delete", "user", f"name={user}", f"account={account}", f"cluster={cluster}"),
        f"{user} leaves {account}",
    )


def _value(field: str, new: object, was: object) -> str:
    if field == "preempt":
        return ",".join(new)  # type: ignore[arg-type]  # "": preempts nothing any more
    if field == "grp_tres" and was:
        # A TRES left out stays as it was: clear each one the new value no longer names.
        named = {p.split("=")[0] for p in str(new).split(",") if p}
        cleared = [f"{p.split('=')[0]}=-1" for p in str(was).split(",") if p and p.split("=")[0] not in named]
        return ",".join([p for p in str(new).split(",") if p] + cleared)
    return str(new)


def _quoted(arg: str) -> str:
    key, eq, value = arg.partition("=")
    if eq and not value:
        return f"{key}=''"
    if eq and (" " in value or ":" in value) and not value.startswith(("'", '"')):
        return f"{key}='{value}'"
    return arg
