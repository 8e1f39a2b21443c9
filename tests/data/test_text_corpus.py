"""`singa-mpi data text`: char-rnn's input.txt and vocab.txt from files or the standard library's source."""
import os

import numpy as np
import pytest

from singa_mpi import cli
from singa_mpi.data import text
from singa_mpi.errors import DataError


def files(tmp_path, *blobs):
    paths = []
    for k, blob in enumerate(blobs):
        path = tmp_path / f"f{k}.txt"
        path.write_bytes(blob)
        paths.append(str(path))
    return paths


def test_the_corpus_is_the_files_in_order_and_the_vocab_their_sorted_bytes(tmp_path):
    paths = files(tmp_path, b"def f():\n\treturn 1\n", b"x = '\xc3\xa9'\n")
    out = str(tmp_path / "out")
    assert text.write_text_corpus(out, paths) == [os.path.join(out, "input.txt"), os.path.join(out, "vocab.txt")]
    corpus = (tmp_path / "out" / "input.txt").read_bytes()
    assert corpus == b"def f():\n\treturn 1\nx = '\xc3\xa9'\n"
    assert (tmp_path / "out" / "vocab.txt").read_bytes() == bytes(sorted(set(corpus)))  # no separators


def test_max_bytes_cuts_the_text(tmp_path):
    paths = files(tmp_path, b"abcdef", b"ghij")
    text.write_text_corpus(str(tmp_path), paths, max_bytes=8)
    assert (tmp_path / "input.txt").read_bytes() == b"abcdefgh"
    assert (tmp_path / "vocab.txt").read_bytes() == b"abcdefgh"
    with pytest.raises(DataError, match="--max-bytes 0: expected a positive number of bytes"):
        text.collect_text(paths, 0)
    with pytest.raises(DataError, match="no text to write"):
        text.collect_text(files(tmp_path, b""), 10)


def test_the_default_corpus_is_the_standard_librarys_plain_source(tmp_path):
    sources = text.stdlib_sources()
    assert sources == sorted(sources) and len(sources) > 50
    assert {os.path.dirname(path) for path in sources} == {os.path.dirname(os.__file__)}
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    text.write_text_corpus(first, max_bytes=300_000)
    text.write_text_corpus(second, max_bytes=300_000)
    corpus = (tmp_path / "a" / "input.txt").read_bytes()
    vocab = (tmp_path / "a" / "vocab.txt").read_bytes()
    assert len(corpus) == 300_000 and corpus == (tmp_path / "b" / "input.txt").read_bytes()
    assert set(vocab) <= set(b"\t\n" + bytes(range(32, 127))) and len(vocab) <= 101  # SINGA's job.conf: 101
    assert b"def " in corpus and b"\n    " in corpus  # words and indentation to learn


def test_read_vocab_and_encode(tmp_path):
    (vocab_path,) = files(tmp_path, b"ba\n")
    vocab = text.read_vocab(vocab_path, "vocab")
    np.testing.assert_array_equal(text.encode(b"ab\nba", vocab, "text", "t.txt", vocab_path), [1, 0, 2, 0, 1])
    with pytest.raises(DataError, match=r"^text t.txt: byte 0x63 'c' at offset 2 is not in the vocabulary "):
        text.encode(b"abc", vocab, "text", "t.txt", vocab_path)
    (repeated,) = files(tmp_path, b"a\nba\n")
    with pytest.raises(DataError, match=r"byte 0x61 'a' at offset 3 repeats the byte at offset 0"):
        text.read_vocab(repeated, "vocab")


def test_the_data_text_command(tmp_path, capsys):
    paths = files(tmp_path, b"hello\n", b"world\n")
    out = str(tmp_path / "out")
    assert cli.main(["data", "text", "--out", out, *paths, "--max-bytes", "9"]) == 0  # files after options
    printed = capsys.readouterr().out
    assert f"wrote {out}/input.txt" in printed and "9 bytes of text, 7 symbols" in printed
    assert (tmp_path / "out" / "input.txt").read_bytes() == b"hello\nwor"
    assert (tmp_path / "out" / "vocab.txt").read_bytes() == b"\nehlorw"
    assert cli.main(["data", "text", paths[1], "--out", out, "--overwrite"]) == 0  # or before them
    assert (tmp_path / "out" / "input.txt").read_bytes() == b"world\n"


def test_data_text_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["data", "text", str(tmp_path / "missing.txt")]) == 2
    assert capsys.readouterr().err.strip() == "singa-mpi: error: data text: --out is required"
    assert cli.main(["data", "text", "--out", str(tmp_path), str(tmp_path / "missing.txt")]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"singa-mpi: error: {tmp_path / 'missing.txt'}: cannot read it") and "\n" not in err
    assert cli.main(["data", "digits", "--out", str(tmp_path), "extra.txt"]) == 2
    assert "unexpected arguments extra.txt" in capsys.readouterr().err
