"""The rules of option values, one definition of each: ``singa-mpi``'s options (:mod:`singa_mpi.cli`
parses their text, then asks here) and the Python API's arguments (:mod:`singa_mpi.api.run` checks
the values a script gives) refuse the same values with the same words, each naming the option its own
way (``argument --steps: -5: expected an integer >= 0``, ``fit: argument steps = -5: expected an
integer >= 0``).  Nothing else is imported: the CLI reads these before it loads anything heavy."""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import pathlib
from typing import Callable, Iterable

INT64 = (-2 ** 63, 2 ** 63 - 1)  # JobProto.seed is an int64


@dataclasses.dataclass(frozen=True)
class ValueRule:
    """Which numbers an option takes: ``whole`` (an integer) or any real number, and ``holds``;
    ``expected`` says it, after the value, in errors."""

    expected: str
    holds: Callable[[float], bool]
    whole: bool = True


COUNT = ValueRule("a count of at least 1", lambda value: value >= 1)
NON_NEGATIVE = ValueRule("an integer >= 0", lambda value: value >= 0)
JOB_SEED = ValueRule(f"a seed between {INT64[0]} and {INT64[1]} (64 bits)",
                     lambda value: INT64[0] <= value <= INT64[1])
DATA_SEED = ValueRule("a seed >= 0", lambda value: value >= 0)  # numpy's generators take no negative seed
# nan compares false: refused as well as inf
POSITIVE_NUMBER = ValueRule("a finite number > 0", lambda value: math.isfinite(value) and value > 0, whole=False)
POSITIVE_SECONDS = ValueRule("a finite number of seconds > 0", POSITIVE_NUMBER.holds, whole=False)


def did_you_mean(bad: str, choices: Iterable[object]) -> str:
    """`` (did you mean 'train'?)`` when one of ``choices`` resembles ``bad`` (a mistyped command,
    choice, option or keyword argument), else "": the hint the CLI and the API add to a refused name."""
    close = difflib.get_close_matches(bad, [str(choice) for choice in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


class BadPath(ValueError):
    """A path an option names that cannot be written; the message is what follows ``PATH: `` in the
    one error line (the CLI and the API each put the option's name in front)."""


def writable_file(text: str) -> str:
    """A file the command will write (see :func:`writable_path`); an existing folder is refused too."""
    if os.path.isdir(text):
        raise BadPath("is a folder: expected a file name")
    return writable_path(text)


def writable_folder(text: str) -> str:
    """A folder the command will write into (see :func:`writable_path`); an existing file is refused too
    (writing into it, the OS says only "File exists")."""
    if os.path.lexists(text) and not os.path.isdir(text):
        raise BadPath("is a file, not a folder: expected a folder (or a path where one can be made)")
    return writable_path(text)


def writable_path(text: str) -> str:
    """A file or folder the command will write: refused now if its nearest existing folder cannot take it
    (a path below a regular file, a folder without write permission, a read-only file system)."""
    path = pathlib.Path(text)
    if not text:
        raise BadPath("expected a file or folder name")
    try:
        exists = path.exists()
    except OSError as err:  # a name too long for the file system, a loop of links
        raise BadPath(f"{err.strerror or err}: expected a path the file system can hold") from None
    if exists:
        if not os.access(path, os.W_OK):
            raise BadPath("cannot be written (permission denied or a read-only file system): expected a path you "
                          "can write")
        return text
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadPath(f"{ancestor} is a file, not a folder: expected a path below a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BadPath(f"cannot create it in {ancestor} (permission denied or a read-only file system): expected "
                      f"a path you can write")
    return text


__all__ = ["ValueRule", "COUNT", "NON_NEGATIVE", "JOB_SEED", "DATA_SEED", "POSITIVE_NUMBER", "POSITIVE_SECONDS",
           "INT64", "BadPath", "writable_file", "writable_folder", "writable_path"]
