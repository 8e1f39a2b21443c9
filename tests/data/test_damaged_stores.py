"""Empty and damaged HDF5 stores: a DataError naming the file and what is wrong, never an IndexError
or one of h5py's RuntimeErrors, when opened directly, in training, and under MPI."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nets
from singa_mpi.data.stores import open_store
from singa_mpi.errors import DataError, SingaError
from singa_mpi.launcher import RunOptions, run_training
from mpi_jobs import mpi_env, mpiexec_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LONG = os.environ.get("SINGA_MPI_FUZZ") == "long"  # the nightly size: every byte, many more examples


def empty_store(path: str) -> str:
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.zeros((0, 12), np.float32))
        f.create_dataset("label", data=np.zeros(0, np.int32))
    return path


def flipped_copy(source: str, target: str, position: int, mask: int = 0xFF) -> str:
    data = bytearray(open(source, "rb").read())
    data[position] ^= mask
    with open(target, "wb") as f:
        f.write(data)
    return target


def read_all(path: str) -> None:
    with open_store("hdf5", path, layer="data", shape=(12,)) as store:
        store.read(np.arange(len(store)))


def test_an_empty_store_is_named_when_opened(tmp_path):
    path = empty_store(str(tmp_path / "empty.h5"))
    with pytest.raises(DataError, match=r"layer 'data': .*empty\.h5: empty HDF5 store \('data' holds no records\)"):
        read_all(path)


def test_every_flipped_byte_of_a_store_reads_or_is_a_data_error_naming_it(tmp_path):
    """Every 7th byte (SINGA_MPI_FUZZ=long: every byte) of a small store flipped in turn (HDF5's superblock, object headers, heaps and the
    data): reading either works (a flip inside the values is not detectable: stores carry no checksums)
    or raises a one-line DataError naming the file; h5py's RuntimeError ("bad heap free list"),
    KeyError, ValueError and TypeError used to escape."""
    good = nets.make_data(str(tmp_path / "good.h5"), 64, (12,), 5)
    target = str(tmp_path / "bad.h5")
    reported = 0
    for position in range(0, os.path.getsize(good), 1 if LONG else 7):
        flipped_copy(good, target, position)
        try:
            read_all(target)
        except DataError as err:
            assert target in str(err) and "\n" not in str(err), (position, str(err))
            reported += 1
    assert reported > 20


def test_random_damage_to_a_store_never_escapes_as_another_exception(tmp_path):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    good = nets.make_data(str(tmp_path / "good.h5"), 64, (12,), 5)
    size = os.path.getsize(good)
    target = str(tmp_path / "bad.h5")

    @hypothesis.settings(max_examples=2000 if LONG else 100, deadline=None,
                         derandomize=not LONG, database=None)
    @hypothesis.given(st.lists(st.tuples(st.integers(0, size - 1), st.integers(1, 255)), min_size=1, max_size=3))
    def damaged_store(flips):
        data = bytearray(open(good, "rb").read())
        for position, mask in flips:
            data[position] ^= mask
        with open(target, "wb") as f:
            f.write(data)
        try:
            read_all(target)
        except DataError as err:
            assert target in str(err)

    damaged_store()


def header_damaged_store(tmp_path) -> str:
    """A store with one flipped byte in its metadata that makes h5py itself raise a RuntimeError (as the
    campaign's "bad heap free list") on opening it and looking up 'data'."""
    good = nets.make_data(str(tmp_path / "good.h5"), 64, (12,), 5)
    for position in range(0, 2048):
        target = flipped_copy(good, str(tmp_path / "data.h5"), position)
        try:
            with h5py.File(target, "r") as f:
                "data" in f  # what HDF5Store asks first
        except RuntimeError:
            return target
        except Exception:  # other damage: look further
            continue
    pytest.fail("no flipped byte in the first 2 KiB gave h5py's RuntimeError")


def train_command(n: int, conf: str, workspace: str) -> list[str]:
    launcher = mpiexec_command(n) if n > 1 else []
    return launcher + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", workspace]


@pytest.mark.parametrize("nranks", [1, 2])
@pytest.mark.parametrize("damage", ["empty", "header"])
def test_training_on_a_bad_store_ends_with_one_line_and_exit_3(tmp_path, damage, nranks):
    data = empty_store(str(tmp_path / "data.h5")) if damage == "empty" else header_damaged_store(tmp_path)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(data, 8, "data", steps=3))
    if nranks == 1:  # in process too: the store's own error (the layer's report keeps its exit code 3)
        with pytest.raises(SingaError, match=r"layer 'data': .*data\.h5: (empty HDF5 store|cannot read it as a hdf5)") as err:
            run_training(str(conf), lambda cfg: str(tmp_path / "ws0"), RunOptions())
        assert err.value.exit_code == DataError.exit_code
    result = subprocess.run(train_command(nranks, str(conf), str(tmp_path / "ws")), cwd=ROOT, env=mpi_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "data.h5" in line]
    assert errors and "layer 'data'" in errors[0], result.stderr[-2000:]
