"""Private places: a directory another user made, or a link, is never adopted; what sres keeps
(the RAM root, the log dir, the run's secret) is the user's alone. A second uid is played by
chown to ``nobody`` (root runs the tests); tests/security does it with real processes."""

from __future__ import annotations

import os
import stat

import pytest

from resilience.contract import run_secret
from resilience.private_paths import NotPrivate, check_private, private_dir
from resilience.tiers import layout

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_directory_is_made_0700_and_an_own_open_one_is_tightened(tmp_path):
    assert mode(private_dir(tmp_path / "new")) == 0o700
    open_one = tmp_path / "open"
    open_one.mkdir(mode=0o777)
    os.chmod(open_one, 0o777)
    assert mode(private_dir(open_one)) == 0o700


@as_root
def test_another_users_directory_and_a_link_are_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(NotPrivate, match=f"belongs to uid {NOBODY}"):
        private_dir(theirs)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "new")
    with pytest.raises(NotPrivate, match="symbolic link"):
        private_dir(link)
    with pytest.raises(NotPrivate, match="symbolic link"):
        check_private(link)


@as_root
def test_a_ram_root_of_another_user_gives_a_private_fallback_named_after_the_runs_secret(
    tmp_path, monkeypatch, capsys
):
    planted = tmp_path / "sres-{uid}"
    real = tmp_path / f"sres-{os.geteuid()}"
    real.mkdir()
    os.chown(real, NOBODY, NOBODY)
    secret = run_secret.new_secret()
    monkeypatch.setenv(layout.RAM_ROOT_ENV, str(planted))
    monkeypatch.setenv(run_secret.ENV, secret)
    layout._private_root.cache_clear()
    root = layout.ram_root()
    assert root != real and root.name.startswith(real.name + "-") and mode(root) == 0o700
    assert f"{real} belongs to uid {NOBODY}" in capsys.readouterr().err
    layout._private_root.cache_clear()
    assert layout.ram_root() == root  # every rank of the run (same secret) picks the same one
    layout._private_root.cache_clear()


def test_the_secret_is_kept_for_the_next_incarnation_and_a_planted_one_is_not_used(tmp_path):
    first = run_secret.kept_in(tmp_path)
    assert run_secret.kept_in(tmp_path) == first and mode(tmp_path / run_secret.KEPT) == 0o600
    (tmp_path / run_secret.KEPT).unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(run_secret.new_secret())
    (tmp_path / run_secret.KEPT).symlink_to(elsewhere)
    again = run_secret.kept_in(tmp_path)
    assert again != elsewhere.read_text() and not (tmp_path / run_secret.KEPT).is_symlink()
    os.chmod(tmp_path / run_secret.KEPT, 0o644)  # readable by others: spent
    assert run_secret.kept_in(tmp_path) != again


@as_root
def test_a_checkpoint_file_another_user_wrote_is_refused_in_one_line_before_unpickling(tmp_path):
    import torch

    from resilience.state import snapshot
    from resilience.tiers import manifest as mf

    path = mf.write(tmp_path, "j", 3, 1, 0, {"replicated": snapshot.capture({"w": torch.ones(4)}, 3)})
    m = mf.read_manifest(path, "j", 1)
    mf.load(path, m)  # the user's own: read
    os.chown(path / "replicated.bin", NOBODY, NOBODY)
    with pytest.raises(
        mf.CheckpointInvalid, match=f"written by uid {NOBODY}, not by this user: not read"
    ) as err:
        mf.load(path, m)
    assert "\n" not in str(err.value)


@as_root
def test_a_log_dir_below_a_directory_another_user_controls_is_refused(tmp_path):
    """Checking the log dir alone once let another user who controlled a directory above it
    swap the run dir for a link (and append to the user's own files through it)."""
    from resilience.private_paths import check_ancestors

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(NotPrivate, match=f"belongs to uid {NOBODY}"):
        check_ancestors(theirs / "mine" / "run")
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(NotPrivate, match="writable by everyone without the sticky bit"):
        check_ancestors(open_to_all / "run")
    os.chmod(open_to_all, 0o1777)  # /tmp's way: no one may rename another's entry
    check_ancestors(open_to_all / "run")
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o2775)  # a project's group directory: the group's decision
    check_ancestors(group / "run")
    link = tmp_path / "link"
    link.symlink_to(theirs)
    with pytest.raises(NotPrivate, match=f"belongs to uid {NOBODY}"):
        check_ancestors(link / "run")  # where the user's own link leads is checked too
