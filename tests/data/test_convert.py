"""Converters from MNIST IDX, CIFAR-10 binary, CSV and scikit-learn's digits, on tiny files made here."""
import gzip
import os
import struct

import numpy as np
import pytest
from sklearn.datasets import load_digits

from singa_mpi.data import convert
from singa_mpi.data.stores import KVFileStore, KVFileWriter, open_store, read_first_record
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

BACKENDS = ["hdf5", "kvfile", "textfile", "shard"]


def write_idx(path, array, magic, gz=False):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())
    return str(path)


def read_all(backend, path, **options):
    store = open_store(backend, path, **options)
    return store.read(np.arange(len(store)))


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_mnist(tmp_path, gz, backend):
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28))
    labels = np.array([3, 1, 4, 1, 5])
    suffix = ".gz" if gz else ""
    img = write_idx(tmp_path / f"images-idx3-ubyte{suffix}", images, 2051, gz)
    lab = write_idx(tmp_path / f"labels-idx1-ubyte{suffix}", labels, 2049, gz)
    out = str(tmp_path / "mnist.store")
    assert convert.convert_mnist(img, lab, out, backend) == [out]
    data, got_labels = read_all(backend, out)
    np.testing.assert_array_equal(data.reshape(5, 28, 28), images)
    np.testing.assert_array_equal(got_labels, labels)
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_mnist_magic_numbers_and_sizes_are_checked(tmp_path):
    labels = write_idx(tmp_path / "lab", np.zeros(2), 2049)
    swapped = write_idx(tmp_path / "img", np.zeros((2, 2, 2)), 2049)
    with pytest.raises(DataError, match="IDX magic number 2049, expected 2051 for MNIST images"):
        convert.convert_mnist(swapped, labels, str(tmp_path / "o.h5"))
    images = write_idx(tmp_path / "img3", np.zeros((3, 2, 2)), 2051)
    with pytest.raises(DataError, match="3 images but .* has 2 labels"):
        convert.convert_mnist(images, labels, str(tmp_path / "o.h5"))
    truncated = tmp_path / "short"
    truncated.write_bytes(open(images, "rb").read()[:-1])
    with pytest.raises(DataError, match="11 bytes of data for dimensions"):
        convert.convert_mnist(str(truncated), labels, str(tmp_path / "o.h5"))
    assert not (tmp_path / "o.h5").exists()


def cifar_batch(path, labels, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (len(labels), 3072)).astype(np.uint8)
    path.write_bytes(np.column_stack([np.array(labels, np.uint8), pixels]).tobytes())
    return str(path), pixels.reshape(-1, 3, 32, 32)


def test_cifar10_kvfile_is_singas_format_with_mean_file(tmp_path):
    first, a = cifar_batch(tmp_path / "data_batch_1.bin", [0, 9, 4], 1)
    second, b = cifar_batch(tmp_path / "data_batch_2.bin", [2], 2)
    out, mean = str(tmp_path / "train.bin"), str(tmp_path / "image_mean.bin")
    assert convert.convert_cifar10([first, second], out, "kvfile", mean_out=mean) == [out, mean]
    store = KVFileStore(out)
    record = store.record(3)
    assert store.keys[:2] == [b"00000", b"00001"]  # create_data.cc's "%05d" keys
    assert list(record.shape) == [3, 32, 32] and record.label == 2 and len(record.data) == 0
    assert record.pixel == b[0].tobytes()
    data, labels = store.read(np.arange(4))
    np.testing.assert_array_equal(data, np.concatenate([a, b]))
    np.testing.assert_array_equal(labels, [0, 9, 4, 2])
    mean_store = KVFileStore(mean)
    assert mean_store.keys == [b"mean"]
    np.testing.assert_allclose(read_first_record(mean), np.concatenate([a, b]).mean(axis=0).reshape(-1), rtol=1e-6)


def test_cifar10_rejects_partial_records_and_foreign_labels(tmp_path):
    (tmp_path / "bad.bin").write_bytes(b"\0" * 100)
    with pytest.raises(DataError, match="100 bytes is not a whole number of CIFAR-10 records"):
        convert.convert_cifar10([str(tmp_path / "bad.bin")], str(tmp_path / "x.h5"))
    path, _ = cifar_batch(tmp_path / "c100.bin", [57], 0)
    with pytest.raises(DataError, match="label byte 57"):
        convert.convert_cifar10([path], str(tmp_path / "x.h5"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_csv(tmp_path, backend):
    (tmp_path / "in.csv").write_text("2;1.5;1\n0;3;-4.25\n")
    out = convert.convert_csv(str(tmp_path / "in.csv"), str(tmp_path / "o"), backend, separator=";")[0]
    data, labels = read_all(backend, out)
    np.testing.assert_array_equal(data, [[1.5, 1], [3, -4.25]])
    np.testing.assert_array_equal(labels, [2, 0])
    (tmp_path / "raw.csv").write_text("1,2\n3,4\n")
    out = convert.convert_csv(str(tmp_path / "raw.csv"), str(tmp_path / "raw.h5"), "hdf5", has_label=False)[0]
    data, labels = read_all("hdf5", out)
    assert labels is None and data.shape == (2, 2)


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    def fail_midway(self, data, labels=None):
        self.write("00000", job_pb2.RecordProto(label=0))
        raise KeyboardInterrupt

    monkeypatch.setattr(KVFileWriter, "write_batch", fail_midway)
    (tmp_path / "in.csv").write_text("1,2\n")
    with pytest.raises(KeyboardInterrupt):
        convert.convert_csv(str(tmp_path / "in.csv"), str(tmp_path / "out.bin"), "kvfile")
    assert sorted(os.listdir(tmp_path)) == ["in.csv"]


def test_sigterm_during_a_conversion_leaves_nothing_and_exits_143(tmp_path, monkeypatch, capsys):
    """SIGTERM (a batch system's stop, `kill`) killed the converter by default, leaving its 40 MB
    temporary file behind for good (the next run's has another PID); now it ends as Ctrl-C does."""
    import signal

    from singa_mpi import cli

    def signalled_midway(self, data, labels=None):
        self.write("00000", job_pb2.RecordProto(label=0))
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, between two bytecodes
        raise AssertionError("SIGTERM did not stop the conversion")

    monkeypatch.setattr(KVFileWriter, "write_batch", signalled_midway)
    (tmp_path / "in.csv").write_text("1,2\n")
    previous = signal.getsignal(signal.SIGTERM)
    assert cli.main(["data", "csv", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.bin"),
                     "--backend", "kvfile"]) == 128 + signal.SIGTERM
    assert sorted(os.listdir(tmp_path)) == ["in.csv"]
    assert capsys.readouterr().err == "singa-mpi: interrupted (SIGTERM: nothing written)\n"
    assert signal.getsignal(signal.SIGTERM) == previous  # the command's handler is gone with it


def test_unknown_backend_is_a_config_error(tmp_path):
    (tmp_path / "in.csv").write_text("1,2\n")
    with pytest.raises(ConfigError, match="expected one of hdf5, kvfile, memory, shard, textfile"):
        convert.convert_csv(str(tmp_path / "in.csv"), str(tmp_path / "o"), "lmdb")


def sorted_rows(data, labels):
    table = np.column_stack([labels, data.reshape(len(data), -1)])
    return table[np.lexsort(table.T[::-1])]


@pytest.mark.parametrize("backend", ["hdf5", "kvfile"])
def test_digits_split_sizes_determinism_and_disjointness(tmp_path, backend):
    train, test = convert.convert_digits(str(tmp_path / "a"), backend)
    assert os.path.basename(train).startswith("train") and os.path.basename(test).startswith("test")
    train_data, train_labels = read_all(backend, train)
    test_data, test_labels = read_all(backend, test)
    assert train_data.shape == (1438, 64) and test_data.shape == (359, 64)
    assert train_data.min() == 0 and train_data.max() == 16  # raw 0..16 values: confs divide by std_value
    # train + test is exactly the data set, each image once: a disjoint split
    digits = load_digits()
    np.testing.assert_array_equal(sorted_rows(np.concatenate([train_data, test_data]),
                                              np.concatenate([train_labels, test_labels])),
                                  sorted_rows(digits.data, digits.target))
    again_train, _ = convert.convert_digits(str(tmp_path / "b"), backend)
    np.testing.assert_array_equal(read_all(backend, again_train)[0], train_data)
    other_train, _ = convert.convert_digits(str(tmp_path / "c"), backend, seed=1)
    assert not np.array_equal(read_all(backend, other_train)[0], train_data)


def test_digits_rejects_a_bad_fraction(tmp_path):
    with pytest.raises(ConfigError, match="test_fraction 1.5"):
        convert.convert_digits(str(tmp_path), test_fraction=1.5)
    for fraction, test in ((0.0001, 0), (0.9999, 1797)):  # an empty split: a reshape error, or an empty store
        with pytest.raises(ConfigError, match=f"test_fraction {fraction}: leaves {test} of 1797 records for testing"):
            convert.convert_digits(str(tmp_path / "d"), "kvfile", test_fraction=fraction)
    assert not (tmp_path / "d").exists()


def test_a_damaged_gzip_is_one_line_naming_the_file(tmp_path):
    """Damage inside the compressed data is zlib's error, not an OSError: it escaped as a traceback."""
    images = write_idx(tmp_path / "i.gz", np.zeros((50, 28, 28)), convert.IDX_IMAGES, gz=True)
    labels = write_idx(tmp_path / "l.gz", np.zeros(50), convert.IDX_LABELS, gz=True)
    blob = bytearray(open(images, "rb").read())
    blob[30:60] = b"\xff" * 30
    open(images, "wb").write(bytes(blob))
    with pytest.raises(DataError, match=f"^{images}: cannot read it"):
        convert.convert_mnist(images, labels, str(tmp_path / "o.h5"))


def test_csv_labels_must_be_whole_numbers(tmp_path):
    """1.7, -3, nan and 1e12 were cast to 1, -3, -2**31 and -2**31 with numpy's warning alone."""
    for label, shown in (("1.7", "1.7"), ("-3", "-3"), ("nan", "nan"), ("1e12", "1000000000000")):
        (tmp_path / "in.csv").write_text("1,0.5\n" + f"{label},0.25\n")
        with pytest.raises(DataError, match=rf"in\.csv: row 2: label {shown.replace('.', '[.]')}: expected a whole"):
            convert.convert_csv(str(tmp_path / "in.csv"), str(tmp_path / "o.h5"))
    assert not (tmp_path / "o.h5").exists()


def test_cifar10_store_and_mean_are_replaced_together(tmp_path):
    """A mean file that cannot be written used to leave the store replaced by the new data."""
    first, _ = cifar_batch(tmp_path / "a.bin", [0, 1, 2], 1)
    second, _ = cifar_batch(tmp_path / "b.bin", [3], 2)
    out = str(tmp_path / "train.h5")
    convert.convert_cifar10([first], out)
    below_a_file = str(tmp_path / "a.bin" / "mean.bin")
    with pytest.raises(DataError, match="cannot write the mean file"):
        convert.convert_cifar10([second], out, mean_out=below_a_file)
    assert len(read_all("hdf5", out)[1]) == 3  # the old store, whole
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin", "train.h5"]


@pytest.mark.parametrize("argv, message", [
    (["csv", "--csv", "{d}/in.csv", "--out", "{d}/in.csv"], "data csv: --out {d}/in.csv is also an input"),
    (["cifar10", "--batches", "{d}/a.bin", "--out", "{d}/o.h5", "--mean", "{d}/o.h5"],
     "data cifar10: --mean {d}/o.h5 is also --out: expected two files"),
    (["csv", "--csv", "{d}/in.csv", "--out", "{d}/o.h5", "--separator", ";;"], "argument --separator: ';;': "
                                                                              "expected one character"),
])
def test_data_refuses_outputs_that_overwrite_its_inputs_and_separators_numpy_cannot_split_on(
        tmp_path, capsys, argv, message):
    from singa_mpi import cli

    (tmp_path / "in.csv").write_text("1,0.5\n")
    argv = [arg.format(d=tmp_path) for arg in argv]
    try:
        code = cli.main(["data", *argv])
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    assert code == 2 and message.format(d=tmp_path) in capsys.readouterr().err
    assert (tmp_path / "in.csv").read_text() == "1,0.5\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_users_output_never_its_temporary_name(tmp_path, backend):
    """The store is written under a temporary name (OUT.tmpPID) and renamed: an error on the way named
    that name (a name the user never gave, of a file that is gone), and an --out that is a folder
    where a file goes (or the reverse) was found only at the rename."""
    images = write_idx(tmp_path / "img", np.zeros((2, 2, 2)), 2051)
    labels = write_idx(tmp_path / "lab", np.zeros(2), 2049)
    longest = str(tmp_path / ("x" * 256))  # one byte more than a file name can hold (its temporary fits)
    with pytest.raises(DataError) as err:
        convert.convert_mnist(images, labels, longest, backend)
    assert str(err.value) == (f"{longest}: cannot write the store: File name too long: expected a path whose "
                              f"folders exist or can be made, on a file system you can write")
    other_kind = tmp_path / ("a_file" if backend == "shard" else "a_folder")
    other_kind.write_text("") if backend == "shard" else other_kind.mkdir()
    with pytest.raises(DataError) as err:
        convert.convert_mnist(images, labels, str(other_kind), backend)
    expected = "a file: expected a folder" if backend == "shard" else "a folder: expected a file name"
    assert str(err.value) == f"{other_kind}: {expected} for the store"
    assert sorted(os.listdir(tmp_path)) == sorted(["img", "lab", other_kind.name])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_name_as_long_as_the_file_system_takes_is_written(tmp_path, backend):
    """A valid --out of 250 characters was refused as "File name too long": the temporary beside it was
    the same name with .tmpPID appended.  A name of 255 bytes (250 letters, .h5 and a 2-byte letter)."""
    images = write_idx(tmp_path / "img", np.arange(8).reshape(2, 2, 2), 2051)
    labels = write_idx(tmp_path / "lab", np.array([3, 1]), 2049)
    for name in ("x" * 250, "é" * 125 + "x.h5"):
        out = str(tmp_path / name)
        assert convert.convert_mnist(images, labels, out, backend) == [out]
        data, stored = read_all(backend, out, **({"has_label": True} if backend == "textfile" else {}))
        np.testing.assert_array_equal(stored, [3, 1])
        assert data.reshape(2, -1)[1].tolist() == [4, 5, 6, 7]
        assert sorted(os.listdir(tmp_path)) == sorted(["img", "lab", *([name] if name[0] == "x" else
                                                                      ["x" * 250, name])])


def test_a_datashard_never_replaces_a_folder_of_other_files(tmp_path):
    """A DataShard --out naming an existing folder replaced it whole: the user's files in it were deleted."""
    images = write_idx(tmp_path / "img", np.zeros((2, 2, 2)), 2051)
    labels = write_idx(tmp_path / "lab", np.zeros(2), 2049)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(DataError) as err:
        convert.convert_mnist(images, labels, str(folder), "shard")
    assert str(err.value) == (f"{folder}: a folder holding notes.txt: expected a new folder or a DataShard's "
                              f"(only shard.dat in it), which the store replaces whole")
    assert (folder / "notes.txt").read_text() == "mine"
    shard = str(tmp_path / "shard")
    for _ in range(2):  # a DataShard is replaced by a new one
        assert convert.convert_mnist(images, labels, shard, "shard") == [shard]
    assert os.listdir(shard) == ["shard.dat"]


@pytest.mark.parametrize("argv, existing", [
    (["mnist", "--images", "{d}/img", "--labels", "{d}/lab", "--out", "{d}/o.h5"], ["--out {d}/o.h5"]),
    (["cifar10", "--batches", "{d}/a.bin", "--out", "{d}/new.h5", "--mean", "{d}/o.h5"], ["--mean {d}/o.h5"]),
    (["csv", "--csv", "{d}/in.csv", "--out", "{d}/o.h5"], ["--out {d}/o.h5"]),
    (["digits", "--out", "{d}/digits"], ["{d}/digits/train.h5", "{d}/digits/test.h5"]),
    (["text", "{d}/in.csv", "--out", "{d}/text"], ["{d}/text/vocab.txt"]),
])
def test_the_converters_replace_an_existing_output_only_with_overwrite(tmp_path, capsys, argv, existing):
    """`singa-mpi data mnist|cifar10|csv|digits|text` replaced existing stores without a word (synthetic
    and examples leave them alone, train refuses another run's workspace without --overwrite)."""
    from singa_mpi import cli

    (tmp_path / "in.csv").write_text("1,0.5\n")
    write_idx(tmp_path / "img", np.zeros((2, 2, 2)), 2051)
    write_idx(tmp_path / "lab", np.zeros(2), 2049)
    cifar_batch(tmp_path / "a.bin", [0, 1], 1)
    for folder in ("digits", "text"):
        (tmp_path / folder).mkdir()
    for path in ("o.h5", "digits/train.h5", "digits/test.h5", "text/vocab.txt"):
        (tmp_path / path).write_text("old")
    argv = [arg.format(d=tmp_path) for arg in argv]
    assert cli.main(["data", *argv]) == 2
    shown = " and ".join(existing).format(d=tmp_path)
    one = len(existing) == 1
    assert capsys.readouterr().err == (f"singa-mpi: error: data {argv[0]}: {shown} {'exists' if one else 'exist'}: "
                                       f"expected --overwrite to replace {'it' if one else 'them'}, or another --out\n")
    assert (tmp_path / "o.h5").read_text() == "old" and (tmp_path / "text" / "vocab.txt").read_text() == "old"
    assert not (tmp_path / "new.h5").exists()
    assert cli.main(["data", *argv, "--overwrite"]) == 0


def test_emnist_labels_past_the_ten_digits_are_converted(tmp_path):
    """EMNIST's IDX files (balanced: labels 0..46) were refused as "expected a digit 0..9 (not an MNIST
    label file?)", with no other converter to turn to; their labels are now stored as the file holds them."""
    images = write_idx(tmp_path / "img", np.arange(16).reshape(4, 2, 2), 2051)
    labels = write_idx(tmp_path / "lab", np.array([3, 9, 12, 46]), 2049)
    out = convert.convert_mnist(images, labels, str(tmp_path / "o.h5"))[0]
    data, stored = read_all("hdf5", out)
    np.testing.assert_array_equal(stored, [3, 9, 12, 46])
    assert data.reshape(4, -1)[3].tolist() == [12, 13, 14, 15]


@pytest.mark.parametrize("source", ["mnist", "cifar10", "csv"])
def test_an_input_that_is_a_folder_is_named_as_one(tmp_path, source):
    """A folder given as an input file was "no such file" (MNIST, CIFAR-10), or Python's
    "[Errno 21] Is a directory: '...'" (CSV)."""
    folder = tmp_path / "a_folder"
    folder.mkdir()
    labels = write_idx(tmp_path / "lab", np.zeros(2), 2049)
    with pytest.raises(DataError) as err:
        if source == "mnist":
            convert.convert_mnist(str(folder), labels, str(tmp_path / "o.h5"))
        elif source == "cifar10":
            convert.convert_cifar10([str(folder)], str(tmp_path / "o.h5"))
        else:
            convert.convert_csv(str(folder), str(tmp_path / "o.h5"))
    assert str(err.value) == f"{folder}: a folder: expected a file"


def test_a_file_where_the_output_folder_goes_is_named_as_one(tmp_path):
    """`data digits --out FILE` (and `data text`) said "cannot write the store: File exists (FILE)"."""
    from singa_mpi.data.text import write_text_corpus

    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(DataError) as err:
        convert.convert_digits(str(a_file))
    assert str(err.value) == f"{a_file}: a file: expected a folder for the digits' train and test stores"
    (tmp_path / "in.txt").write_text("hello")
    with pytest.raises(DataError) as err:
        write_text_corpus(str(a_file), [str(tmp_path / "in.txt")])
    assert str(err.value) == (f"{a_file}: a file: expected a folder for the text and its vocabulary "
                              f"(input.txt, vocab.txt)")
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize("argv, message", [
    (["mnist", "--images", "i", "--labels", "l", "--out", "o.h5", "--mean", "m.bin"],
     "data mnist: --mean is an option of data cifar10: expected options of data mnist (--images, --labels, --out, "
     "--backend, --overwrite)"),
    (["synthetic", "--like", "job.conf", "--out", "x"],
     "data synthetic: --out is an option of data mnist, cifar10, csv, digits and text: expected options of data "
     "synthetic (--like, --count, --classes, --seed, --overwrite)"),
    (["digits", "--out", "d", "--no-label"], "data digits: --no-label is an option of data csv: expected options "
                                             "of data digits (--out, --backend, --test-fraction, --seed, --overwrite)"),
])
def test_an_option_of_another_source_is_refused_not_ignored(tmp_path, capsys, monkeypatch, argv, message):
    """`data mnist ... --mean FILE` wrote no mean file and said nothing; `data synthetic --out DIR` wrote
    at the job's paths, not in DIR."""
    from singa_mpi import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["data", *argv]) == 2
    assert capsys.readouterr().err == f"singa-mpi: error: {message}\n"
    assert os.listdir(tmp_path) == []


def test_an_empty_or_truncated_cifar_batch_says_which(tmp_path):
    """An empty batch file was "0 bytes is not a whole number of CIFAR-10 records"; a truncated one said
    nothing of how much of it was whole."""
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(DataError) as err:
        convert.convert_cifar10([str(tmp_path / "empty.bin")], str(tmp_path / "o.h5"))
    assert str(err.value) == f"{tmp_path / 'empty.bin'}: empty: expected CIFAR-10 records (3073 bytes each)"
    path, _ = cifar_batch(tmp_path / "a.bin", [1, 2], 1)
    (tmp_path / "cut.bin").write_bytes(open(path, "rb").read()[:-5])
    with pytest.raises(DataError) as err:
        convert.convert_cifar10([str(tmp_path / "cut.bin")], str(tmp_path / "o.h5"))
    assert str(err.value) == (f"{tmp_path / 'cut.bin'}: 6141 bytes is not a whole number of CIFAR-10 records (3073 "
                              f"bytes each): 1 whole and 3068 bytes over (a truncated file, or not CIFAR-10's binary "
                              f"version?)")
