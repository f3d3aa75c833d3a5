"""Editing slurm.conf and plugstack.conf for ``sres hooks install --apply``: pure text edits,
and one atomic write that keeps a backup. Applying twice changes nothing the second time."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

MARK = "# sres health hooks (written by 'sres hooks install --apply')"


def _key(line: str) -> str:
    key, sep, _ = line.split("#", 1)[0].partition("=")
    return key.strip().lower() if sep else ""


def apply_slurm_conf_lines(text: str, lines: list[str]) -> str:
    """Set each ``Key=value`` of ``lines`` in slurm.conf text: replace the key's line, or add
    it under our mark; ``SchedulerParameters`` options are merged into the existing line."""
    out = text.splitlines()
    added = []
    for line in lines:
        key, _, value = line.partition("=")
        matches = [i for i, existing in enumerate(out) if _key(existing) == key.lower()]
        if key.lower() == "schedulerparameters" and matches:
            i = matches[-1]  # Slurm uses the last one
            current = out[i].split("#", 1)[0].partition("=")[2].strip()
            options = [o for o in current.split(",") if o]
            missing = [o for o in value.split(",") if o not in options]
            if missing:
                out[i] = f"{out[i].split('=', 1)[0]}={','.join(options + missing)}"
        elif matches:
            out[matches[-1]] = line
        else:
            added.append(line)
    if added:
        if MARK not in out:
            out += ["", MARK]
        at = out.index(MARK) + 1
        while at < len(out) and _key(out[at]):
            at += 1
        out[at:at] = added
    return "\n".join(out) + "\n"


def apply_plugstack_line(text: str, line: str) -> str:
    if any(existing.split() == line.split() for existing in text.splitlines()):
        return text
    return text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"


def write_with_backup(path: Path, new_text: str) -> tuple[bool, Path | None]:
    """Write ``new_text`` atomically if it differs; return (changed, backup of the old file)."""
    old = path.read_text() if path.exists() else None
    if old == new_text:
        return False, None
    backup = None
    if old is not None:
        backup = path.with_name(f"{path.name}.sres-backup-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(path, backup)
    tmp = path.with_name(f".{path.name}.sres-tmp")
    tmp.write_text(new_text)
    if old is not None:
        shutil.copymode(path, tmp)
    os.replace(tmp, path)
    return True, backup
