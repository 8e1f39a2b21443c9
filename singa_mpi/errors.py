"""Exceptions that reach the user as one line, without a traceback."""
from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator

# C0 and C1 controls and the Unicode line separators: what str.splitlines() would break a line at
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class SingaError(Exception):
    """Base class: the CLI prints ``str(err)`` and exits with ``exit_code``."""

    exit_code = 1


class ConfigError(SingaError):
    """A job configuration is malformed or inconsistent (exit code 2).

    The message is one line: ``FILE:LINE:COL: layer 'x' (#i, kType): field = value: expected ...``.
    """

    exit_code = 2


class DataError(SingaError):
    """A data store is missing, truncated or does not match the configured shape."""

    exit_code = 3


class MissingDependency(SingaError):
    """A command needs an optional extra this installation lacks (``plot`` and ``draw``: matplotlib): a
    command line it cannot run (exit code 2), as a ``--plugin`` module that is not installed.  The line
    says what to install.  Extras that only add something fall back instead (no tqdm: no progress bar;
    no Graphviz: ``plan`` writes the .dot file)."""

    exit_code = 2

    def __init__(self, command: str, module: str, install: str):
        super().__init__(f"singa-mpi {command} needs {module}, which is not installed: {install}")


class NonFiniteError(SingaError):
    """A NaN or an infinity in an input batch, a reported metric or a gradient (exit code 5).

    Raised on every rank at the same step (the verdict is voted), before the bad values reach a
    checkpoint: the newest checkpoint of the workspace stays the last good one.
    """

    exit_code = 5
    finding = None  # the group root's own finding (nonfinite.GroupFinding), joined into a job's one line


class ResourceError(SingaError):
    """The machine cannot give what the job needs: memory (exit code 6)."""

    exit_code = 6


class PeerLost(SingaError):
    """MPI reported that a rank this one waits for is gone: its guardian names it (exit code 1)."""


def out_of_memory(err: MemoryError) -> ResourceError:
    """A MemoryError (numpy's says how much, for what shape) as one line saying what to do."""
    detail = " ".join(str(err).split()) or "an allocation failed"
    return ResourceError(f"out of memory ({detail}): lower the batch size or the layer sizes, or spread the "
                         f"job over more ranks (partition_dim: 1 splits params)")


class LayerFailure(SingaError):
    """An error raised while a layer computed; names the layer and the pass, keeps the cause's exit code."""

    def __init__(self, layer: str, direction: str, cause: BaseException, where: str = ""):
        """``where``: the job file's place of the layer (FILE:LINE:COL), where known."""
        if isinstance(cause, MemoryError):
            cause = out_of_memory(cause)
        detail = str(cause) if isinstance(cause, SingaError) else f"{type(cause).__name__}: {cause}"
        prefix = "" if f"'{layer}'" in detail else f"layer '{layer}' ({direction}): "
        super().__init__((f"{where}: " if where else "") + prefix + detail)
        self.layer, self.direction = layer, direction
        self.exit_code = getattr(cause, "exit_code", 1)


class Unwritable(DataError):
    """An output the file system refused, as one line (exit code 3): the path, what it was to hold, the
    OS's reason and, when it is another path (a folder on the way), that path."""

    def __init__(self, path: str, err: OSError, what: str):
        self.path, self.what = path, what
        self.reason = err.strerror or " ".join(str(err).split())
        failed = os.fsdecode(err.filename) if err.filename is not None else None
        where = f" ({failed})" if failed and os.path.abspath(failed) != os.path.abspath(path) else ""
        super().__init__(f"{path}: cannot write {what}: {self.reason}{where}: expected a path whose folders exist "
                         f"or can be made, on a file system you can write")


@contextlib.contextmanager
def writing(path: str, what: str) -> Iterator[str]:
    """Write ``path`` (a file, or a folder of files) in the block: its folder is made first, and an
    OSError on the way is :class:`Unwritable`.  Yields ``path``."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        yield path
    except OSError as err:
        raise Unwritable(path, err, what) from None


def one_line(text: str) -> str:
    """``text`` as one printable line: a newline or other control character that came from the user
    (a layer named "a\\nb" in a job file) is shown escaped, as the file wrote it."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode(), text)
