"""A job's ``checkpoint_path`` files, and which job writes them.

SINGA's stacked jobs (the RBM chain of conf/rbm_mnist_*.conf) start from params another job trained:
``checkpoint_path: "workspace/rbm_mnist_1"`` names that job's workspace (a checkpoint file in it, or
SINGA 0.x's ``.../checkpoint/step<N>-worker<W>``, names it too).  When the file is not there yet, the
line says which job to run first: the job file beside this one whose workspace (``cluster.workspace``,
else ``workspace/<name>``) is that folder; else what file was expected.  ``check`` prints the lines
as warnings; ``train`` refuses with them.  A pipe or a device in its place is refused by both
(:func:`refuse_pipes`).  The rules of what counts as there follow
:func:`singa_mpi.checkpoints.tools.read_initial`, which reads the files (without reading them here).
"""
from __future__ import annotations

import glob
import os
import re

from singa_mpi.checkpoints.hdf5 import checkpoint_dir, listed, refuse_irregular
from singa_mpi.config.limits import MAX_JOB_BYTES
from singa_mpi.config.source import SourceMap
from singa_mpi.errors import DataError

_CHECKPOINT_FILE = re.compile(r"^step(\d+)(?:\.h5|-worker\d+)$")


def missing_checkpoint_paths(cfg) -> list[str]:
    """One line per ``checkpoint_path`` entry of the job (a :class:`~singa_mpi.config.load.JobConfig`)
    that is not there: ``FILE:LINE:COL: checkpoint_path 'P' ...: run JOB first (...)``."""
    lines = []
    for k, path in enumerate(cfg.proto.checkpoint_path):
        problem = _problem(path)
        if problem is not None:
            lines.append(f"{cfg.where('checkpoint_path', k)}: checkpoint_path {path!r}{problem}: "
                         f"{_what_to_do(path, cfg.path)}")
    return lines


def refuse_pipes(cfg) -> None:
    """DataError, in the line ``train`` gives, for a ``checkpoint_path`` entry that is a pipe or a device
    (a folder names a workspace): a missing file is a warning, for the job before this one in a chain
    writes it, but nothing makes a checkpoint of a pipe, and its read would block for good."""
    for k, path in enumerate(cfg.proto.checkpoint_path):
        if os.path.isdir(path):
            continue
        try:
            refuse_irregular(path)
        except DataError as err:
            raise DataError(f"{cfg.where('checkpoint_path', k)}: checkpoint_path {path!r}: {err}") from None


def workspace_named(path: str) -> str:
    """The workspace a ``checkpoint_path`` entry points into: a workspace folder, its checkpoint folder,
    or a checkpoint file in that folder (``step<N>.h5``, SINGA's ``step<N>-worker<W>``)."""
    folder = os.path.normpath(path)
    if _CHECKPOINT_FILE.match(os.path.basename(folder)) or folder.endswith(".h5") or os.path.isfile(folder):
        folder = os.path.dirname(folder) or "."
    if os.path.basename(folder) == "checkpoint":
        folder = os.path.dirname(folder) or "."
    return folder


def writer_of(path: str, job_path: str) -> str | None:
    """The job file in ``job_path``'s folder (not ``job_path`` itself) that trains into the workspace
    ``path`` names, or None.  The files are tokenized, not parsed: a broken one is no candidate."""
    target = os.path.abspath(workspace_named(path))
    for other in sorted(glob.glob(os.path.join(os.path.dirname(job_path), "*.conf"))):
        if os.path.abspath(other) == os.path.abspath(job_path):
            continue
        try:
            with open(other, "rb") as f:
                text = f.read(MAX_JOB_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue
        source = SourceMap(other, text)
        stem = os.path.splitext(os.path.basename(other))[0]
        # the command line's default workspace (cli.resolve_workspace) when the job names none
        workspace = source.value("cluster", "workspace") or os.path.join("workspace", source.value("name") or stem)
        if os.path.abspath(workspace) == target:
            return other
    return None


def _problem(path: str) -> str | None:
    """None when ``path`` is there as ``read_initial`` would take it, else what is wrong (after the path)."""
    if os.path.isdir(path):
        workspace = workspace_named(path)
        return None if listed(workspace) else f": no checkpoint in {checkpoint_dir(workspace)} yet"
    if os.path.exists(path):
        return None
    singa = _CHECKPOINT_FILE.match(os.path.basename(path))
    if singa and not path.endswith(".h5") and os.path.exists(
            os.path.join(os.path.dirname(path), f"step{singa.group(1)}.h5")):
        return None  # SINGA's name of a step this tool wrote as step<N>.h5 beside it
    return " not found"


def _what_to_do(path: str, job_path: str) -> str:
    workspace = workspace_named(path)
    writer = writer_of(path, job_path)
    if writer is not None:
        return f"run {writer} first ({workspace} is its workspace)"
    folder = os.path.join(os.path.dirname(job_path), "")  # "conf/", or "" beside the current folder
    nobody = f"no job file in {folder or './'} trains"
    if os.path.normpath(path) == workspace or os.path.basename(os.path.normpath(path)) == "checkpoint":
        return (f"expected {os.path.join(checkpoint_dir(workspace), 'step<N>.h5')}, written by the job whose "
                f"cluster.workspace is {workspace} ({nobody} there)")
    return f"expected a checkpoint file there ({nobody} into {workspace})"
