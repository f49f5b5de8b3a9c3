"""Atomic writes: a failure or a kill at any moment leaves the old file whole."""

import errno
import os
import stat

import pytest
from pagesim.kernels import atomic_write as aw
from pagesim.kernels.atomic_write import atomic_open, atomic_path, atomic_write


def _no_temp_left(folder):
    assert sorted(p.name for p in folder.iterdir() if ".tmp" in p.name) == []


def test_writes_text_and_bytes_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "out.json"
    atomic_write(path, "old")
    atomic_write(path, "new ✓")
    assert path.read_text(encoding="utf-8") == "new ✓"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    _no_temp_left(tmp_path)


def test_a_full_disk_while_writing_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    path.write_text("the old report")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(aw.os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write(path, "x" * 100_000)
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == "the old report"
    _no_temp_left(tmp_path)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, ValueError])
def test_an_interruption_midway_leaves_the_old_file_whole(tmp_path, interrupt):
    path = tmp_path / "events.jsonl"
    path.write_text("line 1\nline 2\n")
    with pytest.raises(interrupt), atomic_open(path) as f:
        f.write("half a new fi")
        raise interrupt()
    assert path.read_text() == "line 1\nline 2\n"
    _no_temp_left(tmp_path)


def test_the_rename_is_the_last_step(tmp_path, monkeypatch):
    """Until os.replace runs the target holds the old contents (a kill before it changes nothing)."""
    path = tmp_path / "s.toml"
    path.write_text("old")
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        with open(src) as f:
            seen.append((f.read(), path.read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(aw.os, "replace", spy)
    atomic_write(path, "new")
    assert seen == [("new", "old")] and path.read_text() == "new"


def test_a_path_writer_gets_a_temporary_name_with_the_suffix(tmp_path):
    path = tmp_path / "shot.png"
    path.write_bytes(b"old png")
    with atomic_path(path) as tmp:
        assert tmp.endswith(".png") and os.path.dirname(tmp) == str(tmp_path)
        with open(tmp, "wb") as f:
            f.write(b"new png")
    assert path.read_bytes() == b"new png"
    with pytest.raises(OSError), atomic_path(path) as tmp:
        raise OSError("the image writer failed")
    assert path.read_bytes() == b"new png"
    _no_temp_left(tmp_path)


def test_permissions_and_symlinks_are_kept(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, "x")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_device_is_written_in_place_and_its_error_surfaces():
    # Renaming over /dev/full would replace the device node: it is a stream, written as one.
    with pytest.raises(OSError) as info:
        atomic_write("/dev/full", "x" * 10)
    assert info.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    atomic_write(os.devnull, "nothing")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
