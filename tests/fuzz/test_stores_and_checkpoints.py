"""Fuzzing stores and checkpoints: damaged files give their data or one DataError line, never a crash.

Small stores (HDF5, kvfile, CSV text, written by ``singa_mpi.data.convert.write_store``) and the
checkpoints of a short run are damaged: truncated, bits flipped, ranges zeroed or overwritten,
garbage appended or inserted, HDF5 objects and attributes edited with h5py, non-finite values put
into features.  The properties:

* reading a store gives arrays of the declared shape (float32 data, int32 labels), or a DataError
  whose message is one line naming the file; a store without records is a DataError;
* training two steps on a damaged store ends with a documented exit code and one error line, no
  traceback, and no silent NaN (exit 0 only with finite metrics and params);
* reading a checkpoint gives exactly what was written (step, params, updater state, job text,
  plan), or a DataError of one line naming the file;
* ``train --resume`` continues from the newest checkpoint that reads (skipping damaged ones, and
  never silently another job's), removes a dead writer's temporary file, and reaches its last step.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import pathlib
import shutil
import tempfile

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_support as fz
import nets
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.data.convert import write_store
from singa_mpi.data.stores import open_store
from singa_mpi.errors import DataError

pytestmark = pytest.mark.fuzz
FEATURES, CLASSES = 12, 5  # the stores feed tests/nets.py's 12-16-10-5 MLP
NON_FINITE = [math.nan, math.inf, -math.inf, 3e38, -3e38]
ODD_VALUES = [-1, 0, 2**40, -(2**40), 1.5, math.nan, "abc", b"\xff\xfe", np.array([1, 2]), np.array([], np.int64)]


# ------------------------------------------------------------------ damage to bytes

def _position(draw, size: int) -> int:
    """Mostly near the start (headers, superblocks, the first records), sometimes anywhere."""
    return draw(st.one_of(st.integers(0, min(size, 4096)), st.integers(0, size)))


def damage_bytes(draw, blob: bytes) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(["truncate", "flip", "zero", "overwrite", "append", "insert", "empty"]))
    size = len(blob)
    if kind == "truncate":
        at = _position(draw, max(size - 1, 0))
        return blob[:at], f"truncated to {at} of {size} bytes"
    if kind == "flip":
        data = bytearray(blob)
        spots = draw(st.lists(st.tuples(st.integers(0, max(size - 1, 0)), st.integers(0, 7)), min_size=1, max_size=8))
        for at, bit in spots:
            if size:
                data[at] ^= 1 << bit
        return bytes(data), f"bits flipped at {spots}"
    if kind in ("zero", "overwrite"):
        at, length = _position(draw, size), draw(st.integers(1, 4096))
        junk = bytes(length) if kind == "zero" else draw(st.binary(min_size=length, max_size=length))
        return (blob[:at] + junk + blob[at + length:])[:max(size, at)], f"{kind} {length} bytes at {at}"
    if kind == "append":
        junk = draw(st.binary(min_size=1, max_size=256))
        return blob + junk, f"{len(junk)} bytes appended"
    if kind == "insert":
        at, junk = _position(draw, size), draw(st.binary(min_size=1, max_size=64))
        return blob[:at] + junk + blob[at:], f"{len(junk)} bytes inserted at {at}"
    return b"", "emptied"


def damage_file(draw, path: str) -> str:
    blob, what = damage_bytes(draw, pathlib.Path(path).read_bytes())
    pathlib.Path(path).write_bytes(blob)
    return what


# ------------------------------------------------------------------ stores

@st.composite
def stores(draw):
    """(backend, data, labels): a small store's content; float data may hold non-finite values."""
    backend = draw(st.sampled_from(["hdf5", "kvfile", "textfile"]))
    count = draw(st.integers(1, 40))
    pixels = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    data = (rng.integers(0, 256, (count, FEATURES)).astype(np.uint8) if pixels
            else rng.normal(0, 1, (count, FEATURES)).astype(np.float32))
    if not pixels and draw(st.integers(0, 3)) == 0:
        for _ in range(draw(st.integers(1, 3))):
            row, column = draw(st.integers(0, count - 1)), draw(st.integers(0, FEATURES - 1))
            data[row, column] = draw(st.sampled_from(NON_FINITE))
    labels = rng.integers(0, CLASSES, count).astype(np.int32)
    return backend, data, labels


def h5_store_edit(draw, path: str) -> str:
    """An HDF5 store that h5py reads but whose datasets are wrong."""
    kind = draw(st.sampled_from(["no label", "no data", "no records", "1-D data", "text data", "data as group",
                                 "short labels", "2-D labels", "float labels", "labels out of range",
                                 "wrong row size", "scalar data"]))
    with h5py.File(path, "r+") as f:
        count = f["data"].shape[0]
        if kind in ("no label", "short labels", "2-D labels", "float labels", "labels out of range"):
            del f["label"]
        if kind in ("no data", "no records", "1-D data", "text data", "data as group", "wrong row size",
                    "scalar data"):
            del f["data"]
        if kind == "no records":
            f.create_dataset("data", shape=(0, FEATURES), dtype=np.float32)
            del f["label"]
            f.create_dataset("label", shape=(0,), dtype=np.int32)
        elif kind == "1-D data":
            f.create_dataset("data", data=np.zeros(count, np.float32))
        elif kind == "text data":
            f.create_dataset("data", data=np.array([b"abc"] * count))
        elif kind == "data as group":
            f.create_group("data")
        elif kind == "wrong row size":
            f.create_dataset("data", data=np.zeros((count, FEATURES + 1), np.float32))
        elif kind == "scalar data":
            f.create_dataset("data", data=np.float32(1))
        elif kind == "short labels":
            f.create_dataset("label", data=np.zeros(max(count - 1, 0), np.int32))
        elif kind == "2-D labels":
            f.create_dataset("label", data=np.zeros((count, 2), np.int32))
        elif kind == "float labels":
            f.create_dataset("label", data=np.full(count, math.nan, np.float32))
        elif kind == "labels out of range":
            f.create_dataset("label", data=np.full(count, -7, np.int32))
    return kind


def text_store_edit(draw, path: str) -> str:
    """A CSV store with a bad cell, a short row, a header or an odd line ending."""
    lines = pathlib.Path(path).read_text().splitlines()
    row = draw(st.integers(0, len(lines) - 1))
    kind = draw(st.sampled_from(["cell", "short row", "header", "blank line", "crlf", "semicolons"]))
    cells = lines[row].split(",")
    if kind == "cell":
        cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from(["nan", "inf", "-inf", "3e38", "abc", "",
                                                                           "1e999", "0x10", "\u00e9"]))
        lines[row] = ",".join(cells)
    elif kind == "short row":
        lines[row] = ",".join(cells[:-1])
    elif kind == "header":
        lines.insert(0, "label," + ",".join(f"f{i}" for i in range(FEATURES)))
    elif kind == "blank line":
        lines.insert(row, "")
    elif kind == "semicolons":
        lines[row] = lines[row].replace(",", ";")
    pathlib.Path(path).write_text(("\r\n" if kind == "crlf" else "\n").join(lines) + "\n")
    return kind


def damaged_store(draw, folder: str) -> tuple[str, str, str]:
    """(backend, path, what was done): a small store written in ``folder``, then damaged."""
    backend, data, labels = draw(stores())
    path = os.path.join(folder, {"hdf5": "s.h5", "kvfile": "s.bin", "textfile": "s.csv"}[backend])
    write_store(path, backend, data, labels)
    edits = {"hdf5": h5_store_edit, "textfile": text_store_edit}
    nonfinite = data.dtype != np.uint8 and not np.isfinite(data).all()
    how = draw(st.sampled_from(["bytes", "structure", "none"] if backend in edits else ["bytes", "none"]))
    if how == "bytes":
        what = damage_file(draw, path)
    elif how == "structure":
        what = edits[backend](draw, path)
    else:
        what = "intact"
    return backend, path, what + (" (non-finite features)" if nonfinite else "")


def in_fork_problems(function, *args, limit: float = 20) -> list[str]:
    """``function(*args)`` (a list of problems) in a fork: a hang inside libhdf5 is killed and reported."""
    forked = fz.in_fork(function, *args, limit=limit)
    if forked.how == "returned":
        return forked.value
    if forked.how == "timed out":
        return [f"did not end within {limit:g}s (a hang)"]
    return [f"{forked.how}: {str(forked.value).strip().splitlines()[-1:]}"]


def read_store_problems(backend: str, path: str) -> list[str]:
    """The broken promises of reading ``path`` whole: arrays of the declared shape, or one DataError line."""
    try:
        store = open_store(backend, path, "r", shape=(FEATURES,))
        try:
            data, labels = store.read(np.arange(len(store)))
        finally:
            store.close()
    except DataError as err:
        return data_error_problems(err, path)
    except Exception as err:  # noqa: BLE001 - the property: nothing but DataError
        return [f"{type(err).__name__} instead of DataError: {err}"]
    problems = []
    if len(data) == 0:
        problems.append("a store without records read as empty arrays (expected a DataError)")
    if data.dtype != np.float32 or data.shape[1:] != (FEATURES,):
        problems.append(f"data {data.dtype} {data.shape}, expected float32 (N, {FEATURES})")
    if labels is not None and (labels.dtype != np.int32 or labels.shape != (len(data),)):
        problems.append(f"labels {labels.dtype} {labels.shape}, expected int32 ({len(data)},)")
    return problems


def data_error_problems(err: DataError, path: str) -> list[str]:
    message = str(err)
    problems = ["DataError of several lines"] if "\n" in message else []
    return problems + ([] if path in message else [f"DataError without the file's name: {message}"])


@fz.timeout(3600)
@fz.fuzz_settings(ci=150, long=600)
@given(data=st.data())
@pytest.mark.slow
def test_a_damaged_store_reads_or_raises_one_data_error(data):
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-store-") as folder:
        backend, path, what = damaged_store(data.draw, folder)
        problems = in_fork_problems(read_store_problems, backend, path)
        assert not problems, f"{backend} store, {what}: {problems}"


# ------------------------------------------------------------------ training on a damaged store

def mlp_job(folder: str, store: str, backend: str, extra: str = "") -> str:
    """tests/nets.py's data-parallel MLP (batch 8) reading ``store``; returns the job's path."""
    text = nets.mlp(store, 8, "data", steps=2).replace('backend: "hdf5"', f'backend: "{backend}"') + extra
    path = os.path.join(folder, "job.conf")
    pathlib.Path(path).write_text(text)
    return path


def non_finite_results(workspace: str) -> list[str]:
    """Metrics and checkpointed params that are NaN or infinite."""
    bad = []
    metrics = pathlib.Path(workspace, "metrics.jsonl")
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            entry = json.loads(line, parse_constant=float)
            bad += [f"metrics step {entry.get('step')}: {k} = {v}" for k, v in entry.items()
                    if isinstance(v, float) and not math.isfinite(v)]
    for path in sorted(glob.glob(os.path.join(checkpoint.checkpoint_dir(workspace), "step*.h5"))):
        with h5py.File(path, "r") as f:
            bad += [f"{os.path.basename(path)}: params/{name}" for name, ds in f["params"].items()
                    if not np.isfinite(ds[...]).all()]
    return bad


@fz.timeout(3600)
@fz.fuzz_settings(ci=15, long=150)
@given(data=st.data())
def test_training_on_a_damaged_store_fails_in_one_line_or_stays_finite(data):
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-store-") as folder:
        backend, path, what = damaged_store(data.draw, folder)
        workspace = os.path.join(folder, "ws")
        outcome = fz.run_in_process(["train", mlp_job(folder, path, backend), "--workspace", workspace], 120)
        problems = fz.one_line_problems(outcome, fz.documented_codes())
        if outcome.code == 0:
            problems += [f"exit 0 with non-finite {item}" for item in non_finite_results(workspace)]
        assert not problems, f"{backend} store, {what}: {problems}\n{outcome.show()}"


# ------------------------------------------------------------------ checkpoints

STEPS = 3  # the run behind the checkpoint tests writes step1.h5, step2.h5 and step3.h5


def _train(folder: str, name: str, steps: int, activation: str = "kSTanh") -> tuple[str, str]:
    """A short run writing a checkpoint after every step: (job path, workspace)."""
    sub = os.path.join(folder, name)
    os.makedirs(sub)
    data = nets.make_data(os.path.join(sub, "data.h5"), 64, (FEATURES,), CLASSES)
    job = mlp_job(sub, data, "hdf5", extra="checkpoint_freq: 1\n")
    text = pathlib.Path(job).read_text().replace('name: "act1" type: kSTanh', f'name: "act1" type: {activation}')
    pathlib.Path(job).write_text(text)
    workspace = os.path.join(sub, "ws")
    outcome = fz.run_in_process(["train", job, "--workspace", workspace, "--steps", str(steps)], 120)
    assert outcome.code == 0, outcome.show()
    return job, workspace


@dataclasses.dataclass(frozen=True)
class Trained:
    """The run's job and workspace, its checkpoints as read ({file name: Checkpoint}), and a foreign
    checkpoint one step newer: the same params, another activation (so another job identity)."""

    job: str
    workspace: str
    originals: dict = dataclasses.field(repr=False)
    foreign: str

    def __iter__(self):
        return iter((self.job, self.workspace, self.originals, self.foreign))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    folder = str(tmp_path_factory.mktemp("fuzz-ckpt"))
    job, workspace = _train(folder, "run", STEPS)
    originals = {os.path.basename(path): checkpoint.read(path) for _, path in checkpoint.listed(workspace)}
    _, foreign_ws = _train(folder, "foreign", STEPS + 1, activation="kReLU")
    return Trained(job, workspace, originals, checkpoint.checkpoint_path(foreign_ws, STEPS + 1))


def _objects(f: h5py.File) -> list[str]:
    names = []
    f.visit(names.append)
    return names


def h5_checkpoint_edit(draw, path: str) -> str:
    """An HDF5-level edit: attributes changed or deleted, objects deleted, replaced or added."""
    with h5py.File(path, "r+") as f:
        objects = _objects(f)
        kind = draw(st.sampled_from(["root attribute", "delete root attribute", "delete object", "object attribute",
                                     "dataset as group", "dataset retyped", "extra object", "step"]))
        if kind in ("root attribute", "step"):
            name = "step" if kind == "step" else draw(st.sampled_from(sorted(f.attrs)))
            value = draw(st.sampled_from(ODD_VALUES + [int(f.attrs["step"]) + 1, int(f.attrs["step"]) - 1]))
            f.attrs[name] = value
            return f"attribute {name} = {value!r}"
        if kind == "delete root attribute":
            name = draw(st.sampled_from(sorted(f.attrs)))
            del f.attrs[name]
            return f"attribute {name} deleted"
        target = draw(st.sampled_from(objects))
        if kind == "delete object":
            del f[target]
            return f"{target} deleted"
        if kind == "object attribute":
            value = draw(st.sampled_from(ODD_VALUES))
            f[target].attrs[draw(st.sampled_from(["crc32", "t", "batches", "x"]))] = value
            return f"{target} attribute set to {value!r}"
        if kind == "extra object":
            group = f[target] if isinstance(f[target], h5py.Group) else f
            group.create_dataset(f"extra{len(objects)}", data=np.zeros(3, np.float32))
            return f"extra dataset in {group.name}"
        datasets = [name for name in objects if isinstance(f[name], h5py.Dataset)]
        target = draw(st.sampled_from(datasets))
        attrs = dict(f[target].attrs)
        old = f[target][()]
        del f[target]
        if kind == "dataset as group":
            new = f.create_group(target)
        else:
            new = f.create_dataset(target, data=np.asarray(old, np.float64) if np.asarray(old).dtype.kind == "f"
                                   else np.array([1, 2, 3]))
        new.attrs.update(attrs)
        return f"{target}: {kind}"


def same_content(got: checkpoint.Checkpoint, want: checkpoint.Checkpoint) -> list[str]:
    """What a successful read returned differently from what was written."""
    problems = []
    if got.step != want.step:
        problems.append(f"step {got.step}, written {want.step}")
    if got.job_config != want.job_config or got.plan != want.plan:
        problems.append("job_config or plan differ from what was written")
    for what, mine, theirs in (("params", got.params, want.params), ("updater", got.updater, want.updater)):
        if set(mine) != set(theirs):
            problems.append(f"{what} {sorted(mine)}, written {sorted(theirs)}")
    for name in set(got.params) & set(want.params):
        if not np.array_equal(got.params[name], want.params[name]):
            problems.append(f"params/{name} differs from what was written")
    return problems


def read_checkpoint_problems(path: str, original: checkpoint.Checkpoint) -> list[str]:
    try:
        got = checkpoint.read(path)
    except DataError as err:
        return data_error_problems(err, path)
    except Exception as err:  # noqa: BLE001 - the property: nothing but DataError
        return [f"{type(err).__name__} instead of DataError: {err}"]
    return same_content(got, original)


def damage_checkpoint(draw, path: str) -> str:
    """Damage one checkpoint file, in bytes or with h5py; says how."""
    return h5_checkpoint_edit(draw, path) if draw(st.booleans()) else damage_file(draw, path)


@fz.timeout(7200)
@fz.fuzz_settings(ci=120, long=500)
@given(data=st.data())
@pytest.mark.slow
def test_a_damaged_checkpoint_reads_as_written_or_raises_one_data_error(trained, data):
    workspace, originals = trained.workspace, trained.originals
    source = data.draw(st.sampled_from(sorted(originals)))
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-ckpt-") as folder:
        path = os.path.join(folder, source)
        shutil.copy(os.path.join(checkpoint.checkpoint_dir(workspace), source), path)
        what = damage_checkpoint(data.draw, path)
        problems = in_fork_problems(read_checkpoint_problems, path, originals[source])
        assert not problems, f"{os.path.basename(source)}, {what}: {problems}"


def zero_global_heap(path: str) -> None:
    """Zero the objects of the HDF5 global heap (the variable-length strings: job name, identity)."""
    blob = pathlib.Path(path).read_bytes()
    start = blob.index(b"GCOL") + 16
    pathlib.Path(path).write_bytes(blob[:start] + bytes(1024) + blob[start + 1024:])


def zero_superblock(path: str) -> None:
    blob = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(bytes(96) + blob[96:])


def cut_in_half(path: str) -> None:
    blob = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(blob[:len(blob) // 2])


def edit_step(path: str) -> None:
    with h5py.File(path, "r+") as f:
        f.attrs["step"] = int(f.attrs["step"]) + 5


def mark_incomplete(path: str) -> None:
    with h5py.File(path, "r+") as f:
        f.attrs["complete"] = 0


def delete_a_param(path: str) -> None:
    with h5py.File(path, "r+") as f:
        del f["params"][min(f["params"])]


def checksum_as_text(path: str) -> None:
    with h5py.File(path, "r+") as f:
        f["params"][min(f["params"])].attrs["crc32"] = "abc"


def params_as_a_dataset(path: str) -> None:
    with h5py.File(path, "r+") as f:
        del f["params"]
        f.create_dataset("params", data=[1.0])


KNOWN_DAMAGE = {  # the classes of damaged checkpoints, whatever the draw
    "global heap zeroed": zero_global_heap, "superblock zeroed": zero_superblock, "cut in half": cut_in_half,
    "step edited": edit_step, "incomplete": mark_incomplete, "a param deleted": delete_a_param,
    "a checksum as text": checksum_as_text, "params as a dataset": params_as_a_dataset,
}


@pytest.mark.parametrize("damage", sorted(KNOWN_DAMAGE))
def test_known_checkpoint_damage_reads_as_written_or_raises_one_data_error(trained, damage, tmp_path):
    workspace, originals = trained.workspace, trained.originals
    path = str(tmp_path / "step3.h5")
    shutil.copy(checkpoint.checkpoint_path(workspace, STEPS), path)
    KNOWN_DAMAGE[damage](path)
    problems = in_fork_problems(read_checkpoint_problems, path, originals[f"step{STEPS}.h5"])
    assert not problems, f"{damage}: {problems}"


@pytest.mark.parametrize("damage", ["global heap zeroed", "superblock zeroed", "step edited"])
def test_resume_skips_a_known_damaged_newest_checkpoint(trained, damage, tmp_path):
    job, workspace = trained.job, trained.workspace
    ws = str(tmp_path / "ws")
    shutil.copytree(workspace, ws)
    KNOWN_DAMAGE[damage](checkpoint.checkpoint_path(ws, STEPS))
    stale = os.path.join(checkpoint.checkpoint_dir(ws), f"step{STEPS + 7}.h5.tmp{2**22 + 17}")
    pathlib.Path(stale).write_bytes(b"half a checkpoint")
    outcome = resume_outcome(job, ws)
    problems = resume_problems(outcome, ws, [checkpoint.checkpoint_path(ws, STEPS - 1)], False, stale)
    assert not problems, f"{damage}: {problems}\n{outcome.show()}"


def resume_outcome(job: str, workspace: str) -> fz.Outcome:
    return fz.run_in_process(["train", job, "--workspace", workspace, "--resume", "--steps", str(STEPS + 2)], 30)


def readable(path: str, original: checkpoint.Checkpoint) -> bool:
    """The file reads as what was written (a damage that missed everything it holds); a file whose
    reading breaks the read property counts as unreadable (that test reports it)."""
    return fz.in_fork(same_content_as_read, path, original, limit=20).value == []


def same_content_as_read(path: str, original: checkpoint.Checkpoint) -> list[str] | None:
    try:
        return same_content(checkpoint.read(path), original)
    except DataError:
        return None


@fz.timeout(7200)
@fz.fuzz_settings(ci=10, long=100)
@given(data=st.data())
@pytest.mark.slow
def test_resume_continues_from_the_newest_good_checkpoint(trained, data):
    """Some checkpoints damaged, maybe a foreign one newest, a dead writer's temporary file: --resume
    starts at the newest one that reads, refuses a foreign one in one line, and runs on; with every
    one damaged it stops in one line (exit 3) rather than train again from step 0."""
    job, workspace, originals, foreign = trained
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-resume-") as folder:
        ws = os.path.join(folder, "ws")
        shutil.copytree(workspace, ws)
        damaged = data.draw(st.lists(st.sampled_from(sorted(originals)), unique=True, max_size=len(originals)))
        what = {name: damage_checkpoint(data.draw, os.path.join(checkpoint.checkpoint_dir(ws), name))
                for name in damaged}
        with_foreign = data.draw(st.booleans())
        if with_foreign:
            shutil.copy(foreign, checkpoint.checkpoint_dir(ws))
        stale = os.path.join(checkpoint.checkpoint_dir(ws), f"step{STEPS + 7}.h5.tmp{2**22 + 17}")  # no such PID
        pathlib.Path(stale).write_bytes(b"\x89HDF\r\n\x1a\n half a checkpoint")
        good = [checkpoint.checkpoint_path(ws, originals[name].step) for name in
                sorted(originals, key=lambda name: originals[name].step, reverse=True)
                if readable(os.path.join(checkpoint.checkpoint_dir(ws), name), originals[name])]
        outcome = resume_outcome(job, ws)
        problems = resume_problems(outcome, ws, good, with_foreign, stale)
        assert not problems, f"damaged {what}, foreign newest: {with_foreign}: {problems}\n{outcome.show()}"


def resume_problems(outcome: fz.Outcome, ws: str, good: list[str], with_foreign: bool, stale: str) -> list[str]:
    every_damaged = not good and not with_foreign  # (a foreign file reads: it is refused instead)
    problems = fz.one_line_problems(outcome, {3} if every_damaged else {0, 2} if with_foreign else {0})
    if os.path.exists(stale):
        problems.append(f"a dead writer's temporary file stayed: {os.path.basename(stale)}")
    if with_foreign and outcome.code == 2:
        return problems  # refused in one line: another job's checkpoint was newest
    if every_damaged:  # no fresh start that would retrain the run from step 0 without a word
        if "every checkpoint there is damaged" not in outcome.err:
            problems.append("expected 'every checkpoint there is damaged'")
        if os.path.exists(checkpoint.checkpoint_path(ws, STEPS + 2)):
            problems.append(f"step{STEPS + 2}.h5 written: a run started again from step 0")
        return problems
    expected = f"resuming from {good[0]}"
    if expected not in outcome.out + outcome.err:
        problems.append(f"expected '{expected}'")
    if not os.path.exists(checkpoint.checkpoint_path(ws, STEPS + 2)):
        problems.append(f"no step{STEPS + 2}.h5 after the resumed run")
    return problems
