"""Slurm hostlist expressions (``n[1-3,7]``, ``a[01-03],b7``) in pure Python.

Node lists arrive from Slurm compressed, and we hand lists back to it (``scontrol update
NodeList=...``). Doing this without ``scontrol show hostnames`` keeps node discovery working
when slurmctld is slow or unreachable, and keeps the logic unit-testable.

Supported: comma-separated hosts; bracket groups with single numbers and ranges; zero padding
(``n[01-10]`` keeps width 2); several bracket groups in one host (``r[1-2]n[1-3]`` is their
cartesian product, as in Slurm). Compression merges hosts that differ only in their last
number, keeping the first-seen order of groups; duplicates are dropped.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from launcher.errors import HostlistError

__all__ = ["HostlistError", "expand", "compress"]

_MAX_HOSTS = 1_000_000  # Refuse expressions like n[0-999999999] before allocating them.


def expand(expression: str) -> list[str]:
    """Return the host names of ``expression`` in order, without duplicates."""
    if not isinstance(expression, str) or not expression.strip():
        raise HostlistError("empty hostlist")
    hosts: list[str] = []
    seen: set[str] = set()
    for item in _split_top_level(expression):
        for host in _expand_item(item, expression):
            if host not in seen:
                seen.add(host)
                hosts.append(host)
            if len(hosts) > _MAX_HOSTS:
                raise HostlistError(f"hostlist {expression!r} expands to over {_MAX_HOSTS} hosts")
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """Return the shortest usual form of ``hosts``: ``n[1-3,7]``; inverse of :func:`expand`."""
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    order: list[tuple[str, str] | str] = []
    seen: set[str] = set()
    for host in hosts:
        host = host.strip()
        if not host:
            raise HostlistError("empty host name in list")
        if any(c in host for c in "[],"):
            raise HostlistError(f"host name {host!r} contains a hostlist character")
        if host in seen:
            continue
        seen.add(host)
        match = re.fullmatch(r"(.*?)(\d+)(\D*)", host)
        if match is None:
            order.append(host)
            continue
        prefix, digits, suffix = match.groups()
        key = (prefix, suffix)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(digits), len(digits)))
    if not order:
        raise HostlistError("empty host list")
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, suffix = entry
        ranges = _ranges(groups[entry])
        if len(ranges) == 1 and ranges[0].count("-") == 0:
            parts.append(f"{prefix}{ranges[0]}{suffix}")
        else:
            parts.append(f"{prefix}[{','.join(ranges)}]{suffix}")
    return ",".join(parts)


def _split_top_level(expression: str) -> list[str]:
    """Split on commas that are outside brackets, checking bracket balance."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expression:
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {expression!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' in hostlist {expression!r}")
        if char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"unclosed '[' in hostlist {expression!r}")
    items.append("".join(current).strip())
    if any(not item for item in items):
        raise HostlistError(f"empty host name in hostlist {expression!r}")
    return items


def _expand_item(item: str, expression: str) -> list[str]:
    """Expand one host pattern, which may hold several bracket groups."""
    pieces = re.split(r"\[([^\]]*)\]", item)
    # re.split with one capture group alternates: literal, group, literal, group, ..., literal
    literals = pieces[0::2]
    choices = [_expand_group(group, expression) for group in pieces[1::2]]
    hosts = []
    for combination in itertools.product(*choices):
        name = literals[0]
        for number, literal in zip(combination, literals[1:]):
            name += number + literal
        hosts.append(name)
    return hosts


def _expand_group(group: str, expression: str) -> list[str]:
    if not group.strip():
        raise HostlistError(f"empty brackets in hostlist {expression!r}")
    numbers: list[str] = []
    for part in group.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise HostlistError(f"bad range {part!r} in hostlist {expression!r}")
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise HostlistError(f"descending range {part!r} in hostlist {expression!r}")
        if high - low > _MAX_HOSTS:
            raise HostlistError(f"range {part!r} in hostlist {expression!r} is too large")
        width = len(low_text) if low_text.startswith("0") else 0
        numbers.extend(str(n).zfill(width) for n in range(low, high + 1))
    return numbers


def _ranges(numbers: list[tuple[int, int]]) -> list[str]:
    """Format (value, width) pairs as Slurm range strings, merging runs of equal width."""
    ordered = sorted(set(numbers))
    out: list[str] = []
    start = previous = ordered[0]
    for current in ordered[1:] + [None]:  # type: ignore[list-item]
        if current is not None and current[0] == previous[0] + 1 and _same_width(previous, current):
            previous = current
            continue
        low = str(start[0]).zfill(start[1])
        high = str(previous[0]).zfill(previous[1])
        out.append(low if start == previous else f"{low}-{high}")
        if current is not None:
            start = previous = current
    return out


def _same_width(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two numbers can share one range: ``n09``,``n10`` can; ``n9``,``n010`` cannot."""
    return a[1] == b[1] or (len(str(a[0])) == a[1] and len(str(b[0])) == b[1])
