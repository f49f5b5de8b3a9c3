"""Writing a file so that a failure or a kill at any moment leaves the old one whole.

The new contents go to a temporary file beside the target (same folder, so the same file
system), are flushed and fsynced, and only then renamed over the target with
:func:`os.replace`, which is atomic on POSIX and Windows. A reader sees the old file or
the new one, never a mix or a truncated one. On any error the temporary file is removed
and the exception propagates.

A target that exists and is not a regular file (``/dev/null``, ``/dev/full``, a FIFO, a
terminal) is a stream: it is written in place, since renaming over it would replace the
device node. A symbolic link to a regular file is followed: the file it names is
replaced, the link stays. A dangling link is replaced by the new file (following it would
write where no check looked, and past the kernel's guard on links in shared folders).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def _target(path: Path) -> tuple[Path, bool]:
    """(the path to replace, whether it is a stream to write in place)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path, False
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        return path, True
    return Path(os.path.realpath(path)), False


def _mode_for(path: Path) -> int:
    """The permissions the new file gets: the old file's, or what a plain open() would give."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    # The rename itself is durable only once the folder is synced (best effort: not every
    # platform or file system lets a folder be opened).
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _temporary_beside(target: Path, suffix: str) -> Iterator[str]:
    """A new temporary file beside ``target`` that replaces it (with ``target``'s mode) when
    the ``with`` ends cleanly, the body having written and synced it; removed otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(target.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path beside ``path`` for a writer that wants a file name (Qt's image
    writers, NumPy's savez): write it inside the ``with``; on a clean exit it is fsynced and
    renamed over ``path``. The temporary name keeps ``path``'s suffix, which such writers
    read the format from. Raise inside the ``with`` to abandon it (the old file stays)."""
    path = Path(path)
    target, stream = _target(path)
    if stream:
        raise OSError(f"{path} is not a regular file: cannot replace it atomically")
    with _temporary_beside(target, f".tmp{target.suffix}") as tmp:
        yield tmp
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Like ``open(path, mode)`` for writing (``"w"`` or ``"wb"``), atomically: the file
    appears under ``path`` only when the ``with`` ends without an exception."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    encoding = None if "b" in mode else encoding
    path = Path(path)
    target, stream = _target(path)
    if stream:
        with open(target, mode, encoding=encoding) as f:
            yield f
        return
    with _temporary_beside(target, ".tmp") as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write ``data`` (text or bytes) to ``path`` atomically (see the module's docstring)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", encoding) as f:
        f.write(data)
