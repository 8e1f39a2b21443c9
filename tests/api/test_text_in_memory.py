"""A text a script holds as char-rnn's data (``CharRNN.from_text``): a BPTT job trains on it the numbers
it trains on the same text in files, serially and on 2 ranks; a bad text or vocabulary raises one
ArgumentError naming the layer and the argument; a job file cannot carry the text and says so."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import singa_mpi.api as sm
from mpi_jobs import mpi_env, mpiexec_command

TEXT = textwrap.dedent('''
    Each rank of a job holds the same text and reads only the streams of its rows, so the windows of
    characters it learns from are the ones the serial run reads, in the same order, at every step.
''').encode() * 12


def char_job(reader: sm.Layer, vocab_size: int, steps: int = 8) -> sm.Job:
    """SINGA's char-rnn, small: data -> onehot, label; gru1 (8 units) -> ip1 -> loss, unrolled 5 times."""
    def uniform(name: str) -> sm.Param:
        return sm.Param(name, sm.Uniform(-0.3, 0.3))

    net = sm.Net(unroll_len=5, partition_dim=0)
    net.add(reader)
    net.add(sm.Layer("kOneHot", "onehot", "data", unroll_conn_type=["kUnrollOneToAll"],
                     onehot_conf={"vocab_size": vocab_size}))
    net.add(sm.Layer("kRNNLabel", "label", "data", unroll_conn_type=["kUnrollOneToAll"]))
    net.add(sm.Layer("kGRU", "gru1", "onehot", gru_conf={"dim_hidden": 8},
                     params=[uniform(f"{gate}_{part}") for part in ("hx", "hh", "b") for gate in "zrc"]))
    net.add(sm.InnerProduct(vocab_size, "ip1", "gru1", w=uniform("w"), b=uniform("b")))
    net.add(sm.SoftmaxLoss("loss", srcs=["ip1", "label"]))
    return sm.Job("chars", net, algorithm="kBPTT", seed=1, train_steps=steps, disp_freq=1,
                  updater=sm.Updater("kRMSProp", 0.01, rmsprop_conf={"rho": 0.95}, clip_low=-5, clip_high=5))


def _losses(history: sm.History) -> list[float]:
    return [value for _, value in history.metric("loss")]


def test_a_text_in_memory_trains_what_the_same_text_in_files_trains(tmp_path):
    vocab = bytes(sorted(set(TEXT)))
    (tmp_path / "input.txt").write_bytes(TEXT)
    (tmp_path / "vocab.txt").write_bytes(vocab)
    from_files = char_job(sm.CharRNN(str(tmp_path / "input.txt"), str(tmp_path / "vocab.txt"), 4, 5), len(vocab))
    from_text = char_job(sm.CharRNN.from_text(TEXT.decode(), 4, 5), len(vocab))
    assert from_text.check().warnings == []
    files, text = _losses(from_files.fit(tmp_path / "files")), _losses(from_text.fit(tmp_path / "text"))
    assert len(text) == 8 and text == files


@pytest.mark.parametrize("text, vocabulary, message", [
    (b"", None, r"^layer 'data' \(kCharRNN\): argument text is empty"),
    (b"abcab", b"abb", r"^layer 'data' \(kCharRNN\): argument vocabulary repeats a byte"),
    (b"abcab", b"ab", r"^layer 'data' \(kCharRNN\): argument vocabulary lacks b'c' of the text"),
])
def test_a_bad_text_raises_one_line_naming_the_layer_and_the_argument(text, vocabulary, message):
    with pytest.raises(sm.ArgumentError, match=message):
        sm.CharRNN.from_text(text, 4, 5, vocabulary)


def test_a_job_file_cannot_carry_the_text_and_says_so(tmp_path):
    path = tmp_path / "chars.conf"
    char_job(sm.CharRNN.from_text(TEXT, 4, 5), len(set(TEXT))).to_conf(path)
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "train", str(path), "--workspace", str(tmp_path / "ws")],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "no text of that name in this process" in done.stderr


SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]  # this module and tests/mpi_jobs
    from test_text_in_memory import TEXT, char_job
    import singa_mpi.api as sm

    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    history = char_job(sm.CharRNN.from_text(TEXT, 4, 5), len(set(TEXT))).fit(sys.argv[1])
    with open(f"{sys.argv[1]}-rank{rank}.json", "w") as f:
        json.dump([v for _, v in history.metric("loss")], f)
''')


@pytest.mark.slow
def test_a_script_s_text_trains_the_serial_numbers_on_2_ranks(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    here = str(pathlib.Path(__file__).parent)
    for ranks, label in ((1, "one"), (2, "two")):
        prefix = mpiexec_command(ranks) if ranks > 1 else []
        done = subprocess.run(prefix + [sys.executable, str(script), str(tmp_path / label), here], cwd=tmp_path,
                              env=mpi_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    serial = json.loads((tmp_path / "one-rank0.json").read_text())
    assert len(serial) == 8
    for rank in (0, 1):
        assert json.loads((tmp_path / f"two-rank{rank}.json").read_text()) == pytest.approx(serial, rel=1e-5)
