"""Files written whole or not at all: through a temporary file beside them, fsynced and renamed.

The one rule for every file a run leaves (checkpoints, profile.json, stopped.txt, job.conf, the
--trace timeline): a crash, a full disk or a Ctrl-C at any moment leaves the previous file intact and
no part of the new one.  Standard library only: the guardian process (:mod:`singa_mpi.communication.guardian`),
which runs without the packages a rank imports, writes a failed run's timeline through it too.
"""
from __future__ import annotations

import errno
import os

# fsync on a folder refused as unsupported (some FUSE and SMB file systems; PostgreSQL ignores these too):
# nothing more can be done to make the rename durable, as where the folder cannot be opened
_UNSUPPORTED = (errno.EINVAL, errno.ENOTSUP, errno.ENOSYS)


class NotDurable(OSError):
    """The file is written whole and renamed into place, but the fsync of its folder failed (an I/O
    error: the disk is failing): a crash of the machine may still lose the rename.  ``filename``: the
    folder."""


def not_durable(err: NotDurable, what: str = "the file") -> str:
    """What to say of a file :func:`write_durably` raised ``err`` for (``what``: "the checkpoint", ...):
    it is written whole and in place, so never "not written" or "cannot write"."""
    code = f" ({errno.errorcode[err.errno]})" if err.errno in errno.errorcode else ""
    reason = err.strerror or " ".join(str(err).split())
    return (f"{what} is written whole and in place, but may not survive a crash of the machine: the file system "
            f"reported {reason}{code} when making it durable (fsync of {err.filename}): check the disk")


def write_whole(path: str, text: str) -> None:
    """``text`` into ``path`` as :func:`write_durably` writes bytes; a failure is raised with the
    temporary removed."""
    write_durably(path, text.encode())


def temporary(path: str) -> str:
    """The temporary copy of ``path`` that :func:`write_durably` writes beside it, in this process."""
    return f"{path}.tmp{os.getpid()}"


def write_durably(path: str, image: bytes) -> None:
    """``image`` to ``path`` through a temporary file: written, fsynced, renamed (or removed on failure)."""
    tmp = temporary(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(image)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        folder = os.path.dirname(path) or "."
        try:
            fsync_dir(folder)
        except OSError as err:
            raise NotDurable(err.errno, err.strerror, folder) from None
    finally:
        remove_if_there(tmp)


def remove_if_there(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # not there: written and renamed, or never created (a read-only disk)
        pass


def fsync_dir(folder: str) -> None:
    """Make the rename itself durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)
