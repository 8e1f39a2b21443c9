"""HDF5 checkpoints that do not depend on how the job was partitioned.

One file per checkpoint, ``WORKSPACE/checkpoint/step<N>.h5``, readable with
plain h5py or h5dump::

    /                       attrs: format_version, step, job_name, job_identity, seed, nranks, elapsed,
                                   display_window, header_crc32, complete
    /job_config             the job's text (string dataset)
    /plan                   JSON summary of the partitioning it was written under
    /params/<name>          float32, the full logical (unsharded) array
    /updater/<name>/<slot>  float32 updater state (momentum "history", "update"), logical shape;
                            attrs: counters (e.g. Adam's step count "t")
    /readers/<phase>/<layer> attrs: the layer's carried state (``Layer.state()``), e.g. an input
                             layer's ``batches`` (how many global batches it has read)
    /carried/<phase>/<layer>/<name>  float32 arrays a layer carries from batch to batch, one row
                             per row of the global batch (``Layer.carried()``: an RNN's hidden state);
                             of several worker groups, group 0's
    /groups/<g>/carried/<phase>/<layer>/<name>  the same, of worker group g > 0 (groups that keep one
                             pace: distributed Hogwild's); with the root attr ``worker_groups`` (G > 1)

Integrity.  Every dataset carries a ``crc32`` attribute of its bytes (``/job_config`` and ``/plan``:
of their UTF-8 text).  ``header_crc32`` covers the rest: every attribute in the file (the header:
step, format version, job identity, ...; updater counters; readers' state) and the layout (each
group's and dataset's path, shape and type), so an edited ``step``, a renamed param or a flipped bit
in HDF5's own metadata reads as damage.  ``complete`` is set last.  :func:`read` reports any damage as
a DataError naming the file, and :func:`newest_good` skips such files.

Job identity.  ``job_identity`` is a hash of what defines the params: their names and logical shapes
and the train net's layers (names, types, sources) -- :func:`singa_mpi.checkpoints.snapshot.job_identity`;
not the step, seed, learning rate, updater, data or partitioning.  ``--resume`` refuses another job's
checkpoint unless ``--allow-other-job``; a job's ``checkpoint_path`` takes params from other jobs by design.

Writing.  The file is built in memory, then written as ``stepN.h5.tmp<PID>`` in the same folder,
fsynced and renamed, so a crash at any moment leaves the previous checkpoint intact, and a full or
read-only disk is an OSError of plain file I/O, reported as a DataError naming the file and what to do
(HDF5's own writer can crash the process on a full disk).  A writer killed mid-write leaves its
``.tmp<PID>`` behind: :func:`remove_stale_temporaries` deletes those on the next start.

Whole-file seal.  The first 512 bytes of a format-3 file are an HDF5 user block (HDF5 skips it;
h5py and h5dump read the file as usual) holding ``SINGA-MPI-CHECKPOINT``, the length and the crc32
of everything after it.  :func:`read` verifies the seal before HDF5 sees a byte: some damaged
metadata (a zeroed global heap) sends libhdf5 into a loop no Python code can interrupt, so damage
must be caught before the library parses it.

Format versions.  3 adds the seal, ``job_identity``, ``header_crc32`` and the checksums of ``/job_config`` and
``/plan``.  Files of format 2 (no ``header_crc32``) are still read, their arrays verified as before;
their job identity is unknown, so resuming from one is not checked (the launcher says so).
Loading never unpickles: only arrays, numbers and strings are read.
"""
from __future__ import annotations

import dataclasses
import errno
import glob
import io
import json
import os
import re
import time
import warnings
import zlib

import h5py
import numpy as np

from singa_mpi import durable
from singa_mpi.durable import write_durably as _write_durably  # a module global: tests make it fail
from singa_mpi.errors import DataError
from singa_mpi.file_kinds import CHECKPOINT_SEAL, TEXT, kind_of

FORMAT_VERSION = 3
FIRST_CHECKSUMMED_HEADER = 3  # format 2 files have no header_crc32 and unchecked /job_config, /plan
_STEP = re.compile(r"step(\d+)\.h5$")
_TEMPORARY = re.compile(r"step\d+\.h5\.tmp(\d+)$")
STALE_TEMPORARY_SECONDS = 600  # no checkpoint write takes this long: an older .tmp file's writer is gone
EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: stopped on a signal after writing a checkpoint; resume to go on
_SET_AFTER_HEADER_CRC = ("header_crc32", "complete")
USER_BLOCK = 512  # HDF5's smallest user block: the seal lives there
_SEAL_MAGIC = CHECKPOINT_SEAL
_SEAL = re.compile(rb"SINGA-MPI-CHECKPOINT\nlength (\d+)\ncrc32 (\d+)\n")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# What h5py raises on a damaged file depends on the damaged byte (flipping every byte of a small
# checkpoint gives all of these): besides OSError, KeyError and ValueError, RuntimeError ("bad heap
# free list"), and TypeError or AttributeError from objects HDF5 could not resolve.
DAMAGE = (OSError, KeyError, ValueError, RuntimeError, TypeError, AttributeError, IndexError, OverflowError)


class NotACheckpoint(DataError):
    """A file of another kind than a checkpoint (a job file, a data store), or of a newer format: not
    damage, which `ckpt inspect` reports as DAMAGED."""


class NewerFormat(NotACheckpoint):
    """A checkpoint whose seal verifies, of a format newer than this singa_mpi reads: a newer singa_mpi
    wrote it, so `--resume` stops rather than go back past it and write over it."""


class NotDurable(DataError):
    """A checkpoint written whole and renamed into place whose folder's fsync failed (an I/O error): the
    file is there and reads, but a crash of the machine may lose it.  A run stops (the disk is failing).
    ``what``: that, without the file's name and what is left to the user."""

    what: str = ""


@dataclasses.dataclass
class Checkpoint:
    """The content of a checkpoint, as logical arrays."""

    step: int
    params: dict[str, np.ndarray]
    updater: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    counters: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # phase -> layer -> the layer's state (``Layer.state()``: names to numbers)
    readers: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)
    # phase -> layer -> name -> (global batch, ...) array (``Layer.carried()``)
    carried: dict[str, dict[str, dict[str, np.ndarray]]] = dataclasses.field(default_factory=dict)
    # of a job of several worker groups: how many (0: one, or a file written before states were kept per
    # group), and group g > 0 -> its ``carried`` (the groups whose state was gathered: those of one pace)
    worker_groups: int = 0
    group_carried: dict[int, dict[str, dict[str, dict[str, np.ndarray]]]] = dataclasses.field(default_factory=dict)
    job_name: str = ""
    job_config: str = ""
    plan: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    nranks: int = 1
    elapsed: float = 0.0  # seconds of training since step 0 when written (files without it: 0)
    # the train metrics' sums (each ``k`` with its ``k/count``) since the last progress line before the
    # step, over every worker: a resumed run's first line averages the steps an uninterrupted run's does
    # (files without it, and emergency checkpoints, which no collective wrote: {})
    display_window: dict[str, float] = dataclasses.field(default_factory=dict)
    job_identity: str = ""  # snapshot.job_identity of the job that wrote it ("": unknown, format 2)
    format_version: int = FORMAT_VERSION  # of the file it was read from
    path: str = ""


def checkpoint_dir(workspace: str) -> str:
    return os.path.join(workspace, "checkpoint")


def checkpoint_path(workspace: str, step: int) -> str:
    return os.path.join(checkpoint_dir(workspace), f"step{step}.h5")


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def _dataset(group, name: str, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data, np.float32)
    ds = group.create_dataset(name, data=data)
    ds.attrs["crc32"] = crc(data)


def _text_dataset(group, name: str, text: str) -> None:
    ds = group.create_dataset(name, data=text)
    ds.attrs["crc32"] = zlib.crc32(text.encode())


# what a training run that cannot write its checkpoint still has
RUN_GOES_ON = " (the previous checkpoints are intact: continue with --resume once it is fixed)"


def write(path: str, ckpt: Checkpoint, fault_after: int | None = None, option: str = "--workspace",
          after: str = RUN_GOES_ON) -> str:
    """Write ``ckpt`` atomically to ``path``.  A disk that refuses (full, read-only, no permission) is a
    DataError naming the file and what to do (``option``: the option that chooses the place; ``after``:
    what is left to the user, a run's: its previous checkpoints); no part is left.

    ``fault_after`` (tests only) raises after that many parameter datasets, to
    prove that an interrupted write leaves no file behind and the old one intact.
    """
    image = encode(ckpt, fault_after)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _write_durably(path, image)
    except durable.NotDurable as err:  # the file is there: saying it was not written would be false
        what = durable.not_durable(err, "the checkpoint")
        failure = NotDurable(f"{path}: {what}{after}")
        failure.what = what
        raise failure from None
    except OSError as err:
        raise DataError(f"{path}: cannot write the checkpoint: {disk_problem(err, option)}{after}") from None
    return path


def encode(ckpt: Checkpoint, fault_after: int | None = None) -> bytes:
    """The bytes of the checkpoint's HDF5 file, built in memory."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w", userblock_size=USER_BLOCK) as f:
        f.attrs.update(format_version=FORMAT_VERSION, step=ckpt.step, job_name=ckpt.job_name,
                       job_identity=ckpt.job_identity, seed=ckpt.seed, nranks=ckpt.nranks,
                       elapsed=float(ckpt.elapsed), complete=0,
                       display_window=json.dumps(ckpt.display_window, sort_keys=True))
        _text_dataset(f, "job_config", ckpt.job_config)
        _text_dataset(f, "plan", json.dumps(ckpt.plan, sort_keys=True))
        params = f.create_group("params")
        for k, (name, value) in enumerate(sorted(ckpt.params.items())):
            if fault_after is not None and k >= fault_after:
                raise OSError(f"injected fault while writing step {ckpt.step}")
            _dataset(params, name, value)
        updater = f.create_group("updater")
        for name, slots in sorted(ckpt.updater.items()):
            group = updater.create_group(name)
            for slot, value in sorted(slots.items()):
                _dataset(group, slot, value)
            group.attrs.update(ckpt.counters.get(name, {}))
        for name in set(ckpt.counters) - set(ckpt.updater):
            updater.create_group(name).attrs.update(ckpt.counters[name])
        readers = f.create_group("readers")
        for phase, layers in sorted(ckpt.readers.items()):
            group = readers.create_group(phase)
            for layer, state in sorted(layers.items()):
                group.create_group(layer).attrs.update(state)
        _write_carried(f, "carried", ckpt.carried)
        if ckpt.worker_groups > 1:
            f.attrs["worker_groups"] = ckpt.worker_groups
        for g, carried in sorted(ckpt.group_carried.items()):
            _write_carried(f, f"groups/{g}/carried", carried)
        f.attrs["header_crc32"] = _layout_crc(f)
        f.attrs["complete"] = 1
    return seal(buffer.getvalue())


def _write_carried(f, where: str, carried: dict[str, dict[str, dict[str, np.ndarray]]]) -> None:
    for phase, layers in sorted(carried.items()):
        for layer, arrays in sorted(layers.items()):
            group = f.require_group(f"{where}/{phase}/{layer}")
            for name, value in sorted(arrays.items()):
                _dataset(group, name, value)


def seal(image: bytes) -> bytes:
    """``image`` (an HDF5 file with a user block of USER_BLOCK bytes) with the seal of its body written
    into the user block (tests also reseal a file they edited, to reach the checks behind the seal)."""
    body = memoryview(image)[USER_BLOCK:]
    seal = _SEAL_MAGIC + f"length {len(body)}\ncrc32 {zlib.crc32(body)}\n".encode()
    return seal.ljust(USER_BLOCK, b"\0") + body


def _unsealed(path: str, image: bytes) -> bool:
    """True when ``image`` carries a seal that verifies, False for a file written before seals (an
    HDF5 file from byte 0: format 2); DataError for a broken seal or bytes of another kind."""
    if image.startswith(_HDF5_SIGNATURE):
        return False
    m = _SEAL.match(image)
    if m is None:
        kind = kind_of(image) if image else None  # (an empty file: a checkpoint cut to nothing, say)
        raise (DataError if kind is None else NotACheckpoint)(f"{path}: {_what_else(image)}")
    body = memoryview(image)[USER_BLOCK:]
    if int(m.group(1)) != len(body):
        raise DataError(f"{path}: fails its whole-file checksum (the file is truncated or damaged: {len(body)} "
                        f"bytes after its header, written with {int(m.group(1))})")
    if int(m.group(2)) != zlib.crc32(body):
        raise DataError(f"{path}: fails its whole-file checksum (the file is damaged)")
    return True


def _what_else(image: bytes) -> str:
    """What a file that is no checkpoint holds, as far as its first bytes tell (:mod:`singa_mpi.file_kinds`):
    a job file or another text given where a command takes a checkpoint is the usual mix-up
    (``draw filters JOB``)."""
    expected = "expected a checkpoint such as WORKSPACE/checkpoint/step<N>.h5"
    if not image:
        return f"an empty file: {expected}"
    kind = kind_of(image)
    if kind == TEXT:
        return f"{kind} (a job file?), not a checkpoint: {expected}"
    if kind is not None:
        return f"{kind}, not a checkpoint: {expected}"
    return "not a singa_mpi checkpoint, or its first bytes are damaged"


write_whole = durable.write_whole  # the run's small files (profile.json, stopped.txt), written as checkpoints are


# {option}: the option that names the place (a run's --workspace, `ckpt convert`'s --out); {keep}: a
# run's own way to free space, said only for a run's workspace
_DISK_ADVICE = {
    errno.ENOSPC: "the disk is full: free space there{keep} or choose another {option}",
    errno.EDQUOT: "the disk quota is used up: free space there or choose another {option}",
    errno.EROFS: "the file system is read-only: choose a {option} on a writable one",
    errno.EACCES: "no permission to write there: fix its permissions or choose another {option}",
    errno.EPERM: "no permission to write there: fix its permissions or choose another {option}",
    errno.ENAMETOOLONG: "a name is too long for the file system: choose a shorter {option}",
    errno.ENOTDIR: "a part of the path is a file, not a folder: move that file or choose another {option}",
    errno.EEXIST: "a file is where a folder should be: move that file or choose another {option}",
}


def one_line(err: BaseException) -> str:
    """``Type: message`` on one line (HDF5's messages can span several)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


# HDF5's messages, as h5py passes them on: "Unable to synchronously open file (bad superblock version number)"
_HDF5_REASON = re.compile(r"^(?:Unable to|Can't) [^(]*\((.+)\)$")


def _hdf5_reason(err: BaseException) -> str:
    """`` (HDF5: <its reason>)`` when HDF5 said what it found wrong, else nothing: the exception's class
    and h5py's wording about objects of an unexpected kind tell a user nothing about the file."""
    found = _HDF5_REASON.match(" ".join(str(err).split()).strip("'\""))
    return f" (HDF5: {found.group(1)})" if found else ""


def disk_problem(err: OSError, option: str = "--workspace") -> str:
    """``<the OS's words>: <what to do>`` for an OSError from writing into a workspace (``option``: the
    command's option that names the place, `ckpt convert`'s --out)."""
    reason = err.strerror or " ".join(str(err).split())
    advice = _DISK_ADVICE.get(err.errno, "check the disk or choose another {option}")
    keep = " (--keep K keeps fewer checkpoints)" if option == "--workspace" else ""
    return f"{reason}: {advice.format(option=option, keep=keep)}"


def not_written(err: OSError, option: str = "--workspace") -> str:
    """What a note says of a run's by-product file (profile.json, communication.json) whose write raised
    ``err``: ``not written: <the disk's problem>``, or, where only its folder's fsync failed, that it is
    in place (:func:`durable.not_durable`)."""
    if isinstance(err, durable.NotDurable):
        return durable.not_durable(err)
    return f"not written: {disk_problem(err, option)}"


def _scalar(value):
    """An HDF5 attribute as a Python number (numpy scalars do not survive JSON or comparisons well)."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value


def _plain(value):
    """An attribute value as JSON can hold it (numpy scalars and arrays as Python numbers and lists)."""
    return value.tolist() if hasattr(value, "tolist") else value


def _attributes(attrs, skip: tuple[str, ...] = ()) -> dict:
    return {name: _plain(attrs[name]) for name in attrs if name not in skip}


def _layout_crc(f) -> int:
    """crc32 of what the datasets' own checksums do not cover: every attribute (the header included)
    and every group's and dataset's path, shape and type."""
    entries = [["/", None, None, _attributes(f.attrs, skip=_SET_AFTER_HEADER_CRC)]]

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            entries.append([name, list(obj.shape), str(obj.dtype), _attributes(obj.attrs)])
        else:
            entries.append([name, None, None, _attributes(obj.attrs)])

    f.visititems(visit)
    text = json.dumps(sorted(entries, key=lambda entry: entry[0]), sort_keys=True, default=str)
    return zlib.crc32(text.encode())


def _check_header(f, path: str) -> int:
    """The file's format version, once its header and layout verify; DataError otherwise."""
    version = int(f.attrs.get("format_version", 0))
    if "step" not in f.attrs and "complete" not in f.attrs:  # every checkpoint, of any format, has both
        raise NotACheckpoint(f"{path}: an HDF5 file, but not a singa_mpi checkpoint (no step attribute: a data "
                        f"store, say)")
    if version > FORMAT_VERSION:
        raise NewerFormat(f"{path}: checkpoint format {version} is newer than this singa_mpi ({FORMAT_VERSION}), "
                        f"or the file is damaged: upgrade singa_mpi if a newer one wrote it")
    if int(f.attrs.get("complete", 0)) != 1:
        raise DataError(f"{path}: incomplete checkpoint (writing was interrupted)")
    if "header_crc32" in f.attrs:
        if int(f.attrs["header_crc32"]) != _layout_crc(f):
            raise DataError(f"{path}: its header or layout fails its checksum (the file is damaged)")
    elif version >= FIRST_CHECKSUMMED_HEADER:
        raise DataError(f"{path}: format {version} without a header checksum (the file is damaged)")
    return version


def _read_array(ds, path: str, where: str) -> np.ndarray:
    data = ds[...]
    if "crc32" not in ds.attrs:
        raise DataError(f"{path}: {where} has no checksum: not a singa_mpi checkpoint")
    if crc(data) != int(ds.attrs["crc32"]):
        raise DataError(f"{path}: {where} fails its checksum (the file is damaged)")
    return data


def _read_text(f, name: str, path: str, checked: bool) -> str:
    """A string dataset ("" when absent); ``checked``: verified against its crc32 (format 3 on)."""
    if name not in f:
        return ""
    value = f[name][()]
    raw = value if isinstance(value, bytes) else str(value).encode()
    if checked:
        if "crc32" not in f[name].attrs:
            raise DataError(f"{path}: {name} has no checksum: not a singa_mpi checkpoint")
        if zlib.crc32(raw) != int(f[name].attrs["crc32"]):
            raise DataError(f"{path}: {name} fails its checksum (the file is damaged)")
    return raw.decode()


EXPECTED_FILE = "expected a checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5"


def refuse_irregular(path: str, expected: str = EXPECTED_FILE) -> None:
    """DataError when ``path`` is there but is no regular file: a folder, or a device or a pipe, whose
    read would block for good (a FIFO without a writer) or give nothing a checkpoint holds; checked
    before a checkpoint is opened, so that a run refuses it in phase 1, before any communication."""
    if os.path.isdir(path):
        raise DataError(f"{path}: a folder: {expected}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise DataError(f"{path}: not a regular file (a device or a pipe): {expected}")


def _image(path: str) -> bytes:
    """The bytes of the file at ``path`` (a regular file); DataError naming it when it cannot be read."""
    refuse_irregular(path)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise DataError(f"{path}: cannot read the checkpoint: {err.strerror or one_line(err)}") from None


def sound(path: str) -> bool:
    """Whether ``path`` passes the whole-file check :func:`read` (and so :func:`newest_good`) makes
    first, its seal: a damaged or cut file fails it without HDF5 parsing a byte.  A format-2 file, which
    has no seal, is read whole."""
    try:
        if not _unsealed(path, _image(path)):
            read(path)
    except DataError:
        return False
    return True


def newest_sound_step(workspace: str) -> int | None:
    """The step of the newest checkpoint whose seal verifies (:func:`sound`), the one ``--resume`` goes on
    from unless damage inside a sealed file (which a whole-file crc32 all but rules out) makes it skip
    that too; None when there is none.  Cheaper than :func:`newest_good`, which loads the checkpoint."""
    return next((step for step, path in listed(workspace) if sound(path)), None)


def newest_good_said(workspace: str) -> str:
    """What a stop that may not get to write its checkpoint names to go on from: the newest good checkpoint
    (:func:`newest_sound_step`: a damaged newer file, which --resume skips, is not it), or that there is none."""
    step = newest_sound_step(workspace)
    if step is None:
        return f"there is no {'good ' if listed(workspace) else ''}checkpoint (the run would start again at step 0)"
    return f"the newest good checkpoint is {checkpoint_path(workspace, step)} (step {step})"


def read(path: str) -> Checkpoint:
    """Read and verify a checkpoint; DataError naming the file and the damaged part."""
    image = _image(path)
    sealed = _unsealed(path, image)
    try:
        with h5py.File(io.BytesIO(image), "r") as f:
            version = _check_header(f, path)
            if version >= FIRST_CHECKSUMMED_HEADER and not sealed:
                raise DataError(f"{path}: format {version} without its seal (the file is damaged)")
            checked = version >= FIRST_CHECKSUMMED_HEADER
            ckpt = Checkpoint(step=int(f.attrs["step"]), params={}, job_name=str(f.attrs.get("job_name", "")),
                              seed=int(f.attrs.get("seed", 0)), nranks=int(f.attrs.get("nranks", 1)),
                              elapsed=float(f.attrs.get("elapsed", 0.0)),
                              display_window={str(key): float(value) for key, value in  # (not numbers: DAMAGE)
                                              json.loads(f.attrs.get("display_window", "{}")).items()},
                              job_identity=str(f.attrs.get("job_identity", "")), format_version=version, path=path)
            ckpt.job_config = _read_text(f, "job_config", path, checked)
            plan = _read_text(f, "plan", path, checked)
            ckpt.plan = json.loads(plan) if plan else {}
            _read_arrays(f, path, ckpt)
    except DataError:
        raise
    except DAMAGE as err:
        raise DataError(f"{path}: not a readable singa_mpi checkpoint, damaged or of another kind"
                        f"{_hdf5_reason(err)}") from None
    return ckpt


def _read_arrays(f, path: str, ckpt: Checkpoint) -> None:
    """Params, updater state and counters, readers' state and carried arrays, into ``ckpt``."""
    for name, ds in f["params"].items():
        ckpt.params[name] = _read_array(ds, path, f"params/{name}")
    for name, group in f.get("updater", {}).items():
        ckpt.updater[name] = {slot: _read_array(ds, path, f"updater/{name}/{slot}") for slot, ds in group.items()}
        if group.attrs:
            ckpt.counters[name] = {k: int(v) for k, v in group.attrs.items()}
    for phase, group in f.get("readers", {}).items():
        ckpt.readers[phase] = {layer: {k: _scalar(v) for k, v in g.attrs.items()} for layer, g in group.items()}
    ckpt.carried = _read_carried(f.get("carried", {}), path, "carried")
    ckpt.worker_groups = int(f.attrs.get("worker_groups", 0))
    for g, group in f.get("groups", {}).items():
        ckpt.group_carried[int(g)] = _read_carried(group.get("carried", {}), path, f"groups/{g}/carried")


def _read_carried(carried, path: str, where: str) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    return {phase: {layer: {name: _read_array(ds, path, f"{where}/{phase}/{layer}/{name}") for name, ds in g.items()}
                    for layer, g in group.items()} for phase, group in carried.items()}


def listed(workspace: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoint files in the workspace, newest first."""
    found = []
    for path in glob.glob(os.path.join(checkpoint_dir(workspace), "step*.h5")):
        m = _STEP.search(path)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


# what a run that resumes can do when every checkpoint is damaged
RESUME_TODO = "none to continue from; move them aside to start again from step 0"


def newest_good(workspace: str, todo: str = RESUME_TODO) -> Checkpoint | None:
    """The newest checkpoint that reads and verifies; damaged newer ones are skipped with a warning.
    A file of a newer format stops the search (NewerFormat): its writer, a newer singa_mpi, is the one to
    go on from it, and a resume from an older one would write over it.
    None when the workspace has no checkpoint; DataError when it has some and every one is damaged
    (taken for "none", a resumed run would start again from step 0 without a word), ending with
    ``todo``: what the caller, which need not resume (`test`, `sample`), can do about it."""
    files = listed(workspace)
    for _, path in files:
        try:
            return read(path)
        except NewerFormat as err:
            raise NewerFormat(f"{err} (or move it aside to use the older ones)") from None
        except DataError as err:
            warnings.warn(f"skipping damaged checkpoint: {err}", stacklevel=2)
    if files:
        raise DataError(f"{checkpoint_dir(workspace)}: every checkpoint there is damaged ({len(files)} file(s), "
                        f"the newest {os.path.basename(files[0][1])}): {todo}")
    return None


def stale_temporaries(workspace: str, now: float | None = None) -> list[str]:
    """The ``stepN.h5.tmp<PID>`` files of checkpoint writers that are gone: whose PID is no live process
    on this host (or is this process's own: a PID reused), or that nobody has written for
    STALE_TEMPORARY_SECONDS (a writer on another host, a PID since reused by another program)."""
    now = time.time() if now is None else now
    stale = []
    for path in glob.glob(os.path.join(checkpoint_dir(workspace), "step*.h5.tmp*")):
        m = _TEMPORARY.search(path)
        if m is None:
            continue
        try:
            idle = now - os.path.getmtime(path)
        except OSError:  # removed meanwhile (its writer finished)
            continue
        if writer_gone(int(m.group(1)), idle):
            stale.append(path)
    return sorted(stale)


def writer_gone(pid: int, idle: float) -> bool:
    """Whether the writer of a temporary file named for ``pid`` and untouched for ``idle`` seconds is gone:
    ``pid`` is no live process on this host (or is this process's own: a PID reused), or nobody has written
    the file for STALE_TEMPORARY_SECONDS (a writer on another host, a PID since reused by another program)."""
    return pid == os.getpid() or not _process_alive(pid) or idle > STALE_TEMPORARY_SECONDS


def remove_stale_temporaries(workspace: str) -> list[str]:
    """Delete :func:`stale_temporaries`; returns those removed (one that cannot be removed stays)."""
    removed = []
    for path in stale_temporaries(workspace):
        try:
            os.remove(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, OSError):  # a PID no system has
        return False
    return True


def prune(workspace: str, keep: int, written: int | None = None) -> tuple[list[str], dict[str, str]]:
    """Delete all but the ``keep`` newest checkpoints up to step ``written`` (the one just written; None:
    the newest there is); returns the removed paths, and those that could not be removed with the OS's
    reason (permissions, a file in use: the run goes on, the new checkpoint is whole, and the next prune
    tries again).  Newer files are neither counted nor removed: a resume skipped them as damaged, and
    counted, they took the place of the checkpoint just written."""
    removed, refused = [], {}
    for _, path in [(step, path) for step, path in listed(workspace) if written is None or step <= written][keep:]:
        try:
            os.remove(path)
        except FileNotFoundError:  # removed meanwhile
            continue
        except OSError as err:
            refused[path] = err.strerror or one_line(err)
            continue
        removed.append(path)
    return removed, refused


def plan_diff(saved: dict, current: dict) -> list[str]:
    """Short human-readable differences between two plan summaries."""
    lines = []
    if saved.get("nranks") != current.get("nranks"):
        lines.append(f"workers: {saved.get('nranks')} -> {current.get('nranks')}")
    old, new = saved.get("layers", {}), current.get("layers", {})
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            lines.append(f"layer {name}: {old.get(name, 'absent')} -> {new.get(name, 'absent')}")
    return lines
