"""Directories no other user can read, plant or redirect.

A cluster node is shared: whoever comes first can create ``/dev/shm/<name>`` or a job's log
directory, make it a symbolic link to somewhere else, or leave it open to all. So a directory
sres keeps state in is used only when it is a real directory (never a link) owned by the user,
and it is made mode 0700: what lies inside (checkpoints, events with the command line, the
control token) is then the user's and root's alone, whatever the files' own modes, and no one
else can plant anything below it.

Standard library only: the admins' hooks (as root, for the job's user) use it too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from resilience.errors import NotPrivate

__all__ = ["NotPrivate", "check_ancestors", "check_private", "open_own_dir", "private_dir"]


def check_private(path: Path, uid: int | None = None) -> Path:
    """``path`` if it is a directory, not a link, owned by ``uid`` (default: this process's
    user); raises :class:`NotPrivate` naming why not. Reads nothing inside it."""
    fd = _open_dir(path)
    try:
        _check_owner(path, fd, os.geteuid() if uid is None else uid)
    finally:
        os.close(fd)
    return path


def private_dir(path: Path) -> Path:
    """Create ``path`` mode 0700 (its missing parents with the user's umask), or adopt it when it
    is already this user's own directory, tightening its mode to 0700. Raises
    :class:`NotPrivate` for a link, a non-directory or another user's directory."""
    os.close(open_private_dir(path))
    return Path(path)


def open_private_dir(path: Path) -> int:
    """:func:`private_dir`, and a descriptor of it for the caller to read and write through
    (and close): what was made private is what is used, with no second open by path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = _open_dir(path)  # checked and changed through the descriptor: a swap cannot redirect it
    try:
        mode = _check_owner(path, fd, os.geteuid())
        if mode & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_ancestors(path: Path, uid: int | None = None) -> None:
    """Raise :class:`NotPrivate` when another user controls a directory above ``path``: one of
    another user's (root's excepted), or one anyone may write without the sticky bit (``/tmp``
    and ``/dev/shm`` have it). Such a user could rename the directory below it away and put a
    link of theirs in its place; checking ``path`` alone once let another user swap a run's log
    dir and append to the user's own files through a link. A group-writable directory is the
    admins' and the group's decision, and is accepted."""
    uid = os.geteuid() if uid is None else uid
    lexical, real = Path(os.path.abspath(path)).parents, Path(os.path.realpath(path)).parents
    for parent in dict.fromkeys([*lexical, *real]):  # where a link leads is checked too
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            continue  # created later, by us
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                raise NotPrivate(f"{parent} is a link of uid {st.st_uid}'s: it decides where {path} is")
            continue  # the user's or root's own link
        if st.st_uid not in (uid, 0):
            raise NotPrivate(f"{parent} belongs to uid {st.st_uid}, who could swap what is below it")
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise NotPrivate(f"{parent} is writable by everyone without the sticky bit")


def open_own_dir(path: Path, dir_fd: int | None = None) -> int:
    """A descriptor of directory ``path`` (its last part opened in ``dir_fd`` when given) when
    it is this user's and no one else may write it; raises :class:`NotPrivate` naming why not.

    What is read through the descriptor (``/proc/self/fd/N/...``) is what was checked: a
    library that reopens files by path (DCP unpickles ``.metadata``) cannot be handed another
    user's file by a rename between the check and the read, and no one else can create or
    rename anything inside. The caller closes it."""
    path = Path(path)
    fd = _open_dir(path, dir_fd)
    try:
        mode = _check_owner(path, fd, os.geteuid())
        if mode & 0o022:
            raise NotPrivate(f"{path} is writable by others (mode {mode:04o}): not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(path: Path, dir_fd: int | None = None) -> int:
    name = path.name if dir_fd is not None else path
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise NotPrivate(f"{path} does not exist") from None
    except OSError as err:
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            link = False
        if link:
            raise NotPrivate(f"{path} is a symbolic link") from None
        raise NotPrivate(f"{path} cannot be opened as a directory of its own ({err.strerror})") from None


def _check_owner(path: Path, fd: int, uid: int) -> int:
    st = os.fstat(fd)
    if st.st_uid != uid:
        raise NotPrivate(f"{path} belongs to uid {st.st_uid}, not to uid {uid}")
    return stat.S_IMODE(st.st_mode)
