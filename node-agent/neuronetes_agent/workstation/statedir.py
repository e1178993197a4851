"""The state directory, checked before use; every file in it opened without following links.

Another local user must not make the daemon read or write a file of their choosing, nor read what
it keeps (docs/workstation.md, "The state directory"). So:

- the directory (created ``0700`` when missing) must belong to the user running the daemon and be
  writable by nobody else, or the daemon refuses it with one line; so must each directory in it;
- it is opened once, and every file and directory in it is reached relative to that descriptor,
  one name at a time, with ``O_NOFOLLOW``: a symbolic link is refused, never followed, and so is
  anything but a regular file where a file is expected (a FIFO cannot block the daemon either).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

__all__ = ["StateDir", "StateDirError", "check_dir", "check_socket"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class StateDirError(OSError):
    """The state directory, or something in it, is not safe to use (one line)."""


def check_dir(st: os.stat_result, path: Path, what: str = "state directory") -> None:
    """Refuse a directory another user owns or may write."""
    uid = os.geteuid()
    if st.st_uid != uid:
        raise StateDirError(
            f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {uid}): refusing to use it"
        )
    if st.st_mode & 0o022:
        raise StateDirError(
            f"{what} {path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o}):"
            f" refusing to use it; `chmod go-w {path}` if it is yours"
        )


def check_socket(state_dir: Path, socket: Path) -> None:
    """What a client checks before talking to the daemon: the directory as above, and a socket of
    the user's own (not one another user put there)."""
    check_dir(os.stat(state_dir), state_dir)
    st = os.lstat(socket)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        raise StateDirError(f"{socket} is not a socket of yours: refusing to talk to it")


def _refused(path: Path, exc: OSError) -> StateDirError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return StateDirError(
            f"{path} is a symbolic link: the daemon does not follow links in its state directory"
        )
    if exc.errno == errno.ENOTDIR:
        return StateDirError(f"{path} is not a directory")
    if exc.errno == errno.ENXIO:  # a FIFO (or socket) opened for writing without blocking
        return StateDirError(f"{path} is not a regular file of yours: refusing to use it")
    return StateDirError(f"{path}: {exc.strerror}")


class StateDir:
    """The checked state directory and an open descriptor on it (`fd`)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _refused(path, exc) from None
        try:
            check_dir(os.fstat(self.fd), path)
        except StateDirError:
            os.close(self.fd)
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def open_dir(self, parts: Sequence[str], *, create: bool = True) -> int:
        """A descriptor on the directory `parts` below the state directory (each created ``0700``
        when missing, and checked like the state directory). The caller closes it."""
        fd = os.dup(self.fd)
        path = self.path
        try:
            for name in parts:
                path = path / name
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise
                except OSError as exc:
                    raise _refused(path, exc) from None
                os.close(fd)
                fd = sub
                check_dir(os.fstat(fd), path, "directory")
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def directory(self, parts: Sequence[str], *, create: bool = True) -> Iterator[int]:
        fd = self.open_dir(parts, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def open(self, parts: Sequence[str], flags: int, mode: int = 0o600) -> int:
        """A regular file below the state directory, opened with ``O_NOFOLLOW`` relative to its
        directory (created `mode` with ``O_CREAT``). Raises StateDirError (a link, not a regular
        file) or FileNotFoundError."""
        *dirs, name = parts
        path = self.path.joinpath(*parts)
        with self.directory(dirs, create=bool(flags & os.O_CREAT)) as dirfd:
            try:
                fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=dirfd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise _refused(path, exc) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise StateDirError(f"{path} is not a regular file of yours: refusing to use it")
        return fd

    def make_private(self, names: Sequence[str], *, create: str = "") -> None:
        """Files of the state directory, where they exist (`create` is created), as regular files
        of the user's with mode 0600."""
        for name in names:
            try:
                fd = self.open([name], os.O_RDWR | (os.O_CREAT if name == create else 0))
            except FileNotFoundError:
                continue
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
