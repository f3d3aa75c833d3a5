"""Applying a policy to a running cluster's accounting: read what is there, change what differs,
and undo the changes made so far when Slurm refuses one.

``sacctmgr`` has no transaction, so "never half-applied" is kept by hand: before the first
change, the objects this project manages are read; when a command is refused, the same planner
that made the changes turns what is there back into what was there. What that cannot undo (the
accounting daemon gone in between) is said in the error, with the command that was refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.errors import ApplyFailed, SlurmError
from launcher.governance import changes as ch
from launcher.governance.policy import Policy, check_capacity
from launcher.governance.slurm_objects import MARK, Account, Objects, conf_gaps, conf_lines, desired
from launcher.slurm.accounting import Accounting
from launcher.slurm.client import SlurmClient


@dataclass(frozen=True)
class Outcome:
    cluster: str
    changes: tuple[ch.Change, ...]
    conf_gaps: tuple[tuple[str, str, str], ...]
    """(key, wanted, running): slurm.conf lines the running controller lacks."""
    applied: bool


def apply(
    policy: Policy,
    client: SlurmClient,
    accounting: Accounting,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Make the accounting database hold what ``policy`` stands for (``dry_run``: only say how)."""
    config = client.config()
    need_accounting(config)
    cluster = policy.cluster or config.get("ClusterName", "")
    if cluster not in accounting.clusters():
        raise SlurmError(
            f"the accounting database knows no cluster {cluster!r}: add it (sacctmgr -i add cluster "
            f"{cluster}) or name the right one (cluster: in the policy)"
        )
    nodes = policy.cluster_nodes or len(client.nodes())
    check_capacity(policy, nodes, policy.cluster_gpus)
    before, foreign = read_managed(accounting, cluster)
    todo = ch.plan(before, desired(policy, nodes, policy.cluster_gpus), cluster, foreign)
    gaps = tuple(conf_gaps(conf_lines(policy), config))
    if not dry_run:
        _run(todo, accounting, cluster, before, say)
    return Outcome(cluster, tuple(todo), gaps, applied=not dry_run)


def need_accounting(config: dict[str, str]) -> None:
    """Governance lives in the accounting database: without slurmdbd, say so in one line."""
    storage = config.get("AccountingStorageType", "")
    if storage != "accounting_storage/slurmdbd":
        raise SlurmError(
            f"this cluster keeps no accounting database (AccountingStorageType={storage or 'none'}): "
            "teams and QOS need slurmdbd (docs/admin/governance.md)"
        )


def read_managed(accounting: Accounting, cluster: str) -> tuple[Objects, frozenset[str]]:
    """The objects on ``cluster`` this project manages, and the names of every other QOS and
    account (which a policy may not take over)."""
    qos, foreign = {}, set()
    for r in accounting.qos():
        if r.description.startswith(MARK):
            qos[r.name] = r
        else:
            foreign.add(r.name)
    descriptions = accounting.account_descriptions()
    ours = {name for name, d in descriptions.items() if d.startswith(MARK)}
    foreign |= set(descriptions) - ours
    accounts, members = {}, set()
    for a in accounting.associations(cluster):
        if a.account not in ours:
            continue
        if a.user:
            members.add((a.user, a.account))
        else:
            accounts[a.account] = Account(
                a.account, descriptions[a.account], a.fairshare, a.qos, a.default_qos, a.grp_tres
            )
    return Objects(qos, accounts, frozenset(members)), frozenset(foreign)


def _run(
    todo: list[ch.Change], accounting: Accounting, cluster: str, before: Objects, say: Callable[[str], None]
) -> None:
    for done, change in enumerate(todo):
        say(f"  {change.what}")
        try:
            accounting.change(change.args)
        except SlurmError as err:
            undone = _undo(accounting, cluster, before) if done else "nothing to undo"
            raise ApplyFailed(
                f"Slurm refused '{change.shell()}' ({err}) after {done} of {len(todo)} changes; {undone}"
            ) from None


def _undo(accounting: Accounting, cluster: str, before: Objects) -> str:
    try:
        now, _ = read_managed(accounting, cluster)
        for change in ch.plan(now, before, cluster):
            accounting.change(change.args)
    except SlurmError as err:
        return f"undoing them failed too ({err}): apply the policy again once Slurm answers"
    return "those were undone: nothing changed"
