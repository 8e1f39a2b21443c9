"""`singa-mpi data synthetic --like JOB`: what it writes, and what it leaves alone."""
import os
import pathlib

from singa_mpi.data.synthetic import write_synthetic

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_a_script_s_arrays_and_text_are_no_files_to_write(tmp_path, monkeypatch):
    """A job whose store (or char-rnn text) a Python script holds (backend memory, memory: paths) stopped
    with "memory:x@abc.tmpPID: the memory backend is read-only", naming a temporary file; its text was
    written to a file named memory:...; now only the mean and std files it names are written."""
    monkeypatch.chdir(tmp_path)
    text = (REPO / "conf" / "digits_mlp.conf").read_text()
    text = text.replace('backend: "hdf5" path: "data/digits/train.h5"',
                        'backend: "memory" path: "memory:x@abc" mean_file: "mean.bin"')
    (tmp_path / "job.conf").write_text(text)
    assert 'backend: "memory"' in text
    assert write_synthetic("job.conf", count=5) == ["mean.bin", "data/digits/test.h5"]
    text = (REPO / "conf" / "char_rnn.conf").read_text()
    (tmp_path / "rnn.conf").write_text(text.replace('path: "data/text/input.txt"', 'path: "memory:t@1"'))
    assert 'path: "memory:t@1"' in (tmp_path / "rnn.conf").read_text()
    assert write_synthetic("rnn.conf", count=5) == []
    assert sorted(os.listdir(tmp_path)) == ["data", "job.conf", "mean.bin", "rnn.conf"]
