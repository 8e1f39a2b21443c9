"""What a damaged HDF5 store's one line says: the file, that it is damaged or not HDF5, HDF5's own reason
when it gives one, and what was expected; never the name of the Python exception h5py raised (the
campaign's `... (RuntimeError: Unable to synchronously check link existence (wrong B-tree signature))`)."""
import os
import re

import h5py
import numpy as np
import pytest

import nets
from singa_mpi.data.stores import open_store
from singa_mpi.errors import DataError

EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Warning)\b")
EXPECTED = "expected an HDF5 file with a 'data' dataset of records (N, *shape), as `singa-mpi data` writes"


def flipped(source: str, target: str, position: int) -> str:
    data = bytearray(open(source, "rb").read())
    data[position] ^= 0xFF
    with open(target, "wb") as f:
        f.write(data)
    return target


def read_all(path: str) -> None:
    with open_store("hdf5", path) as store:
        store.read(np.arange(len(store)))


def test_no_flipped_byte_gives_a_python_exception_name(tmp_path):
    """Every 3rd of the first 2 KiB (headers, heaps, B-trees) and every 11th byte after flipped in turn."""
    good = nets.make_data(str(tmp_path / "good.h5"), 64, (12,), 5)
    size = os.path.getsize(good)
    damaged = 0
    for position in list(range(0, min(size, 2048), 3)) + list(range(2048, size, 11)):
        target = flipped(good, str(tmp_path / f"bad{position}.h5"), position)
        try:
            read_all(target)
        except DataError as err:
            message = str(err)
            assert message.startswith(target) and "\n" not in message, (position, message)
            assert not EXCEPTION_NAME.search(message) and "Errno" not in message, (position, message)
            if "damaged" in message:
                damaged += 1
                assert message.endswith(EXPECTED) or "write it again" in message, (position, message)
        os.remove(target)
    assert damaged > 30


def test_hdf5s_reason_is_kept_without_the_exception_name(tmp_path):
    """A flip that makes h5py raise its RuntimeError on looking up 'data' (the campaign's B-tree case)."""
    good = nets.make_data(str(tmp_path / "good.h5"), 64, (12,), 5)
    for position in range(2048):
        target = flipped(good, str(tmp_path / f"bad{position}.h5"), position)
        try:
            with h5py.File(target, "r") as f:
                "data" in f
        except RuntimeError as err:
            reason = re.search(r"\((.*)\)$", str(err)).group(1)
            break
        except Exception:
            continue
    else:
        pytest.fail("no flipped byte in the first 2 KiB gave h5py's RuntimeError")
    with pytest.raises(DataError) as err:
        read_all(target)
    assert str(err.value) == (f"{target}: cannot read it as a hdf5 store: damaged, or not an HDF5 file "
                              f"(HDF5: {reason}): {EXPECTED}")


def test_a_file_that_is_not_hdf5_at_all(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("label,v1\n1,2\n")
    with pytest.raises(DataError) as err:
        read_all(str(path))
    assert str(err.value) == (f"{path}: cannot read it as a hdf5 store: damaged, or not an HDF5 file "
                              f"(HDF5: file signature not found): {EXPECTED}")
