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


def test_a_job_without_data_files_is_not_told_they_exist(tmp_path, capsys, monkeypatch):
    """A job that names no data files was told "the job's data files exist (use --overwrite ...)"."""
    from singa_mpi import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.conf").write_text('name: "x"\n')
    assert cli.main(["data", "synthetic", "--like", "job.conf"]) == 0
    assert capsys.readouterr().out == "nothing to write: job.conf names no data files\n"
    (tmp_path / "digits.conf").write_text((REPO / "conf" / "digits_mlp.conf").read_text())
    assert cli.main(["data", "synthetic", "--like", "digits.conf", "--count", "5"]) == 0
    assert cli.main(["data", "synthetic", "--like", "digits.conf"]) == 0
    assert capsys.readouterr().out.endswith(
        "nothing to write: the job's data files exist (use --overwrite to replace them)\n")


def test_a_plugin_s_data_is_not_said_to_exist(tmp_path):
    """examples/rnnlm's job (its reader a plugin's: synthetic makes none of its data) was told its data
    files exist; in a fresh process, as protobuf keeps the plugin's extensions for the process's life."""
    import subprocess
    import sys

    job = tmp_path / "job.conf"
    job.write_text(f'plugin: "{REPO / "examples" / "rnnlm" / "rnnlm.py"}"\n'
                   + (REPO / "examples" / "rnnlm" / "job.conf").read_text())
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "data", "synthetic", "--like", str(job)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("nothing written: data synthetic does not make examples/rnnlm/train_data.bin ([data_conf]."
                           "path of layer 'data'): make it with `python examples/rnnlm/create_data.py --python-docs "
                           "--out DIR` (or --train FILE)\n")


def test_a_store_path_that_cannot_be_written_names_the_job_s_field(tmp_path, capsys, monkeypatch):
    """`data synthetic --overwrite` onto a store path that is a folder (or below a file) named the path
    alone, not the job's file:line and field as its other path errors (a missing store) do."""
    from singa_mpi import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.conf").write_text((REPO / "conf" / "digits_mlp.conf").read_text())
    (tmp_path / "data" / "digits" / "train.h5").mkdir(parents=True)
    assert cli.main(["data", "synthetic", "--like", "job.conf", "--overwrite", "--count", "5"]) == 3
    assert capsys.readouterr().err == ("singa-mpi: error: job.conf:24:34: layer 'data': store_conf.path "
                                       "data/digits/train.h5: a folder: expected a file name for a synthetic store\n")
    text = (REPO / "conf" / "cifar10_convnet.conf").read_text()
    (tmp_path / "cifar.conf").write_text(text.replace('mean_file: "', 'mean_file: "a-file/'))
    (tmp_path / "a-file").write_text("")
    assert cli.main(["data", "synthetic", "--like", "cifar.conf", "--count", "5"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("singa-mpi: error: cifar.conf:") and err.count("\n") == 1, err
    assert ": layer 'data': store_conf.mean_file a-file/" in err and "cannot write the mean file" in err, err
