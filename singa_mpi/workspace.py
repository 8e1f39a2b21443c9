"""A run's workspace: claimed before any communication (another run's checkpoints are refused unless
the run continues them or moves them aside), created and proved writable, a previous run archived.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import time
from typing import Sequence

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.trainer import STOP_NOTE


JOB_FILE = "job.conf"  # the job a run in the workspace trains, as the Python API writes it there


def write_job_file(path: str, text: str) -> None:
    """``text`` to ``path`` whole (a temporary file renamed over it: a reader never sees half of it),
    with the mode any new file gets (0666 less the umask: readable by others, as the run's other files).
    Written as the run's other small files are (:func:`checkpoint.write_whole`); the next start also
    clears the ``job.conf.<PID>.tmp`` that versions before it left."""
    checkpoint.write_whole(path, text)


def claim_workspace(workspace: str, options, is_root: bool, outputs: Sequence[str] = ()) -> None:
    """Before any communication (``options``: the run's ``resume`` and ``overwrite``): refuse a workspace that holds another run's checkpoints unless the
    run continues it (``--resume``) or moves it aside (``--overwrite``, done by the root, with the
    files of the job's output layers, ``outputs``).  The root
    also makes sure it can write there (:func:`make_workspace`) and removes the temporary files of
    checkpoint writers that were killed (a one-line note says which)."""
    resume, overwrite = options.said("--resume"), options.said("--overwrite")  # the caller's words for them
    if options.resume and options.overwrite:
        raise ConfigError(f"{resume} and {overwrite} together: expected one of them ({resume} continues the "
                          f"run in the workspace, {overwrite} moves it aside)")
    found = [] if options.resume else checkpoint.listed(workspace)
    if found and not options.overwrite:
        raise ConfigError(f"{workspace} holds another run's checkpoints (newest {found[0][1]}): expected "
                          f"{resume} to continue that run, or {overwrite} to move it to {workspace}/previous-<time>/")
    if not is_root:
        return
    make_workspace(workspace)
    clear_dead_writes(workspace)
    if options.overwrite:
        try:
            moved, target = archive_run(workspace, outputs)
        except OSError as err:
            raise DataError(f"--overwrite: could not move the previous run in {workspace} aside: "
                            f"{checkpoint.disk_problem(err)}") from None
        if moved:
            print(f"--overwrite: moved the previous run ({', '.join(moved)}) to {target}", flush=True)


# the temporary names of the run's other files written whole (profile.json, communication.json,
# stopped.txt, metrics.jsonl: ``NAME.tmp<PID>``; job.conf: ``job.conf.<PID>.tmp``)
_RUN_FILE_TEMPORARY = re.compile(r"^(?:(?:profile\.json|communication\.json|stopped\.txt|metrics\.jsonl)\.tmp(\d+)"
                                 r"|job\.conf\.(\d+)\.tmp)$")


def clear_dead_writes(workspace: str) -> None:
    """Remove the temporary files of checkpoint writers that were killed, and those of the run's other
    files (:func:`stale_run_file_temporaries`), with a one-line note each (the root's, on the next start:
    a --resume refused for another job's checkpoint clears them too)."""
    removed = checkpoint.remove_stale_temporaries(workspace)
    if removed:
        print(f"note: removed {len(removed)} temporary file(s) of an interrupted checkpoint write: "
              f"{', '.join(removed)}", flush=True)
    removed = []
    for path in stale_run_file_temporaries(workspace):
        try:
            os.remove(path)
        except OSError:  # one that cannot be removed stays
            continue
        removed.append(path)
    if removed:
        print(f"note: removed {len(removed)} temporary file(s) of an interrupted write of the run's files: "
              f"{', '.join(removed)}", flush=True)


def stale_run_file_temporaries(workspace: str, now: float | None = None) -> list[str]:
    """The temporary files in ``workspace`` of writers of the run's files (profile.json, communication.json,
    stopped.txt, metrics.jsonl, job.conf) that are gone, by the rule for checkpoints'
    (:func:`singa_mpi.checkpoints.hdf5.writer_gone`); a live writer's stay."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(workspace)
    except OSError:
        return []
    stale = []
    for name in names:
        m = _RUN_FILE_TEMPORARY.match(name)
        if m is None:
            continue
        path = os.path.join(workspace, name)
        try:
            idle = now - os.path.getmtime(path)
        except OSError:  # removed meanwhile (its writer finished)
            continue
        if os.path.isfile(path) and checkpoint.writer_gone(int(m.group(1) or m.group(2)), idle):
            stale.append(path)
    return sorted(stale)


def make_workspace(workspace: str) -> None:
    """Create the workspace and prove it writable, and its checkpoint folder if there is one: a
    DataError naming the path and what to do otherwise (a file in the way, a read-only or full disk,
    a name too long), before any work is done."""
    folder = workspace
    try:
        os.makedirs(workspace, exist_ok=True)
        _probe_write(workspace)
        folder = checkpoint.checkpoint_dir(workspace)
        if os.path.lexists(folder):  # else the first checkpoint creates it
            _probe_write(folder)
    except OSError as err:
        blocker = file_in_the_way(folder)
        if blocker:
            raise DataError(f"{folder}: cannot create this workspace folder: {blocker} is a file, not a folder: "
                            f"move that file or choose another --workspace") from None
        raise DataError(f"{folder}: cannot write into this workspace folder: {checkpoint.disk_problem(err)}") from None


def probe_file_folder(path: str, option: str, beside: Sequence[str] = ()) -> None:
    """A DataError now if the folder of ``path`` (its nearest existing one: the writer makes the rest) takes no
    new file: the option's parser asks os.access, which says yes to root on a read-only or virtual file system
    (/proc), and the file is written only at the end of the run.  ``beside``: the names of the files its
    writers put beside it (its temporary copy, the ranks' parts), each probed too: a name the file system
    holds may not hold with a suffix (File name too long, at the end of the run)."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    name = None
    try:
        for name in (None, *beside):
            _probe_write(folder, name)
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG and name is not None:
            raise DataError(f"{option} {path}: the run writes {name} beside it, which {folder} cannot hold: "
                            f"{err.strerror}: expected a shorter name") from None
        raise DataError(f"{option} {path}: cannot write a file in {folder}: {err.strerror or err}: expected a path "
                        f"on a file system you can write") from None


def _probe_write(folder: str, name: str | None = None) -> None:
    """Create and remove a file in ``folder`` (``name``: by that name; one that exists is left alone)."""
    probe = os.path.join(folder, name or f".singa-mpi-write-test-{os.getpid()}")
    try:
        with open(probe, "xb"):
            pass
    except FileExistsError:  # (another's file of that name: it is not ours to remove)
        return
    os.remove(probe)


def file_in_the_way(path: str) -> str | None:
    """The nearest of ``path`` and its parents that exists and is not a folder, if any."""
    path = os.path.abspath(path)
    while True:
        if os.path.lexists(path):
            return None if os.path.isdir(path) else path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def archive_run(workspace: str, outputs: Sequence[str] = ()) -> tuple[list[str], str]:
    """Move a previous run's checkpoint folder, metrics.jsonl, communication.json and output layers' files
    (``outputs``) to ``WORKSPACE/previous-<time>/``; returns (what moved, where).  Other files (logs) stay.
    An output file keeps its path under the workspace; one outside it goes there by its name.  The
    run's job.conf goes with it as a copy: the new run may be reading that very file (``singa-mpi train
    WORKSPACE/job.conf --overwrite``); the Python API replaces it once the new run starts."""
    names = [name for name in (os.path.basename(checkpoint.checkpoint_dir(workspace)), "metrics.jsonl",
                               "communication.json", STOP_NOTE) if os.path.exists(os.path.join(workspace, name))]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = os.path.join(workspace, f"previous-{stamp}"), 1
    while os.path.exists(target):
        n += 1
        target = os.path.join(workspace, f"previous-{stamp}-{n}")
    if names:
        os.makedirs(target)
        for name in names:
            os.replace(os.path.join(workspace, name), os.path.join(target, name))
        if os.path.isfile(os.path.join(workspace, JOB_FILE)):
            shutil.copy2(os.path.join(workspace, JOB_FILE), os.path.join(target, JOB_FILE))
            names.append(f"a copy of {JOB_FILE}")
    for path in outputs:
        if os.path.isfile(path):
            inside = os.path.relpath(path, workspace)
            name = inside if not inside.startswith(os.pardir) else path
            where = os.path.join(target, inside if name == inside else os.path.basename(path))
            (stem, ext), n = os.path.splitext(where), 1
            while os.path.exists(where):  # two outside outputs of one name
                n += 1
                where = f"{stem}-{n}{ext}"
            os.makedirs(os.path.dirname(where), exist_ok=True)
            shutil.move(path, where)
            names.append(name)
    return names, target
