"""examples/rnnlm: SINGA 0.3's rnnlm example as a plugin, tested as its user meets it.

* create_data.py: the vocabulary (``</s>`` first, then by count), SINGA's class split (old_classes),
  ``--vocab-size`` and ``<unk>``, and the kvfile of WordRecords it writes (read back record by record);
* kData's windows (SINGA's rule: from the previous window's last word to the next ``</s>``, at most
  ``max_window`` words, round and round the file), its invalid rows, and its row slices;
* the gradients of kEmbedding, kHidden and kLoss against central differences (kEmbedding adds up a
  word used twice in a window, where SINGA's Copy kept the last use only);
* a small rnnlm job on 2 and 3 workers as serially, kHidden whole and the rest split;
* the real thing in subprocesses: create_data.py --python-docs, then SINGA's own job.conf (only its data
  paths changed) trained serially and on ``mpiexec -n 2`` with equal metrics and a falling loss;
* ``singa-mpi check`` on SINGA's stored job.conf with and without the plugin.

rnnlm_pb2 and create_data.py are imported when a test first needs them, not at collection: protobuf
keeps an extension's declaration for the life of the process (conftest's plugins.isolated() cannot take
it back), and a job that writes ``[data_conf]`` with no plugin loaded reads differently once it is declared.
"""
from __future__ import annotations

import difflib
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi import cli, plugins  # plugins maps job_pb2, which rnnlm_pb2 imports
from singa_mpi.data.stores import KVFileWriter, scan_kvfile
from singa_mpi.layers.base import LayerContext
from singa_mpi.testing import build_layer, check_equivalence, check_layer_gradients
from mpi_jobs import mpi_env, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "rnnlm"
PLUGIN = EXAMPLE / "rnnlm.py"
SINGA_JOB = EXAMPLE / "job.conf"
STORED_JOB = ROOT / "tests" / "config" / "singa_examples" / "v0.2.0" / "examples" / "rnnlm" / "job.conf"

INPUT, TARGET, CLASS, CLASS_START, CLASS_END, VALID = range(6)  # kData's columns
UNIFORM = 'init { type: kUniform low: -0.3 high: 0.3 }'


def pb2():
    """examples/rnnlm/rnnlm_pb2 (the WordRecord message), imported from its folder as the plugin does."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import rnnlm_pb2

    return rnnlm_pb2


_create_data = []


@pytest.fixture
def create_data():
    """examples/rnnlm/create_data.py as a module (imported once)."""
    if not _create_data:
        spec = importlib.util.spec_from_file_location("rnnlm_create_data", EXAMPLE / "create_data.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _create_data.append(module)
    return _create_data[0]


@pytest.fixture
def rnnlm():
    """The plugin loaded in this process (conftest forgets it after the test)."""
    plugin = plugins.load(str(PLUGIN))
    assert plugin.names == {"layer type": ["kData", "kEmbedding", "kHidden", "kLabel", "kLoss"]}, plugin.names
    return sys.modules[plugin.module]


def read_records(path) -> tuple[list[bytes], list]:
    """Every (key, WordRecord) of a kvfile create_data.py wrote."""
    data = pathlib.Path(path).read_bytes()
    keys, offsets, lengths = scan_kvfile(data, str(path))
    records = []
    for at, size in zip(offsets, lengths):
        record = pb2().WordRecord()
        record.ParseFromString(data[at:at + size])
        records.append(record)
    return list(keys), records


def write_text(path, sentences) -> str:
    pathlib.Path(path).write_text("".join(" ".join(s) + "\n" for s in sentences))
    return str(path)


# ------------------------------------------------------------------ create_data.py

def test_vocabulary_puts_end_of_sentence_first_then_words_by_count(create_data):
    sentences = [["b", "a", "b"], ["c", "b", "a"], ["d"], ["e", "c", "a", "b"]]
    # counts: b 4, a 3, c 2, d 1, e 1 (d before e: ties keep first appearance); </s> once a sentence
    assert create_data.build_vocab(sentences, 0) == [("</s>", 4), ("b", 4), ("a", 3), ("c", 2), ("d", 1), ("e", 1)]
    assert create_data.build_vocab(sentences, 6) == create_data.build_vocab(sentences, 0)  # fits: no <unk>
    # 5 words at most: </s>, the 3 most frequent, and <unk> for the rest (d and e: count 2, after a tie with c)
    assert create_data.build_vocab(sentences, 5) == [("</s>", 4), ("b", 4), ("a", 3), ("c", 2), ("<unk>", 2)]
    # 4 at most: <unk> takes c, d and e (count 4) and sorts among the words by its count
    assert create_data.build_vocab(sentences, 4) == [("</s>", 4), ("b", 4), ("<unk>", 4), ("a", 3)]


def old_classes(counts: list[int], class_size: int) -> list[int]:
    """The RNNLM toolkit's splitClasses with old_classes = 1, as create_data.cc has it."""
    total, df, a, out = float(sum(counts)), 0.0, 0, []
    for count in counts:
        df = min(df + count / total, 1)
        out.append(a)
        if df > (a + 1) / class_size and a < class_size - 1:
            a += 1
    return out


def test_classes_split_the_vocabulary_by_cumulative_frequency(create_data):
    # running frequency 0.3, 0.6, 0.8, 1.0 against 1/3, 2/3: the class moves on after passing each
    assert create_data.split_classes([3, 3, 2, 2], 3) == [0, 0, 1, 2]
    assert create_data.split_classes([5, 1, 1, 1], 2) == [0, 1, 1, 1]
    assert create_data.split_classes([1] * 6, 1) == [0] * 6  # one class: every word
    rng = np.random.default_rng(3)
    for _ in range(20):
        counts = sorted(rng.integers(1, 200, size=int(rng.integers(5, 60))).tolist(), reverse=True)
        size = int(rng.integers(1, 12))
        classes = create_data.split_classes(counts, size)
        assert classes == old_classes(counts, size)
        assert classes[0] == 0 and max(classes) < size
        assert all(0 <= b - a <= 1 for a, b in itertools.pairwise(classes))  # contiguous, non-decreasing


def test_create_data_writes_word_records_with_their_classes(tmp_path, capsys, create_data):
    train = write_text(tmp_path / "train.txt", [["the", "cat", "sat"], ["the", "dog", "sat", "down"],
                                                 ["a", "cat", "and", "the", "dog"], [], ["the", "end"]])
    valid = write_text(tmp_path / "valid.txt", [["the", "cow", "sat"], ["zebra"]])
    out = tmp_path / "out"
    assert create_data.main(["--train", train, "--valid", valid, "--out", str(out), "--class-size", "3",
                             "--vocab-size", "0"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'train_data.bin'}: 19 words" in printed  # 14 words and 5 </s> (the empty line's too)
    assert f"wrote {out / 'valid_data.bin'}: 4 words" in printed  # cow and zebra dropped: no <unk>
    assert not (out / "test_data.bin").exists()

    vocab = [line.split("\t") for line in (out / "vocab.txt").read_text().splitlines()]
    words = [w for w, *_ in vocab]
    assert [int(i) for _, i, _, _ in vocab] == list(range(len(vocab)))
    # </s> 5, the 4, then cat, sat and dog 2 each in order of appearance
    assert words[:5] == ["</s>", "the", "cat", "sat", "dog"] and "<unk>" not in words
    counts = [int(c) for *_, c in vocab]
    assert counts[0] == 5 and counts[1:] == sorted(counts[1:], reverse=True)
    classes = [int(c) for _, _, c, _ in vocab]
    assert classes == create_data.split_classes(counts, 3)
    bounds = {c: (classes.index(c), len(classes) - classes[::-1].index(c)) for c in set(classes)}

    index = {w: i for i, w in enumerate(words)}
    for name, expected in (("train", ["the", "cat", "sat", "</s>", "the", "dog", "sat", "down", "</s>", "a", "cat",
                                      "and", "the", "dog", "</s>", "</s>", "the", "end", "</s>"]),
                           ("valid", ["the", "sat", "</s>", "</s>"])):
        keys, records = read_records(out / f"{name}_data.bin")
        assert keys == [f"{k:05d}".encode() for k in range(len(expected))]
        assert [r.word for r in records] == expected
        for r in records:
            assert r.word_index == index[r.word] and r.class_index == classes[r.word_index]
            assert (r.class_start, r.class_end) == bounds[r.class_index]
            assert r.class_start <= r.word_index < r.class_end


def test_vocab_size_maps_rare_and_unknown_words_to_unk(tmp_path, capsys, create_data):
    train = write_text(tmp_path / "train.txt", [["x", "x", "x", "y", "y", "z"], ["x", "y", "w"]])
    valid = write_text(tmp_path / "valid.txt", [["x", "w", "never", "seen"]])
    out = tmp_path / "out"
    assert create_data.main(["--train", train, "--valid", valid, "--out", str(out), "--class-size", "2",
                             "--vocab-size", "4"]) == 0
    capsys.readouterr()
    words = [line.split("\t")[0] for line in (out / "vocab.txt").read_text().splitlines()]
    assert words == ["</s>", "x", "y", "<unk>"]  # x 4, y 3, <unk> = z + w = 2; </s> first whatever its count
    _, train_records = read_records(out / "train_data.bin")
    assert [r.word for r in train_records] == ["x", "x", "x", "y", "y", "z", "</s>", "x", "y", "w", "</s>"]
    assert [r.word_index for r in train_records] == [1, 1, 1, 2, 2, 3, 0, 1, 2, 3, 0]
    _, valid_records = read_records(out / "valid_data.bin")
    assert [r.word_index for r in valid_records] == [1, 3, 3, 3, 0]  # w, never, seen: <unk>
    assert [r.word for r in valid_records] == ["x", "w", "never", "seen", "</s>"]  # the word as written


# ------------------------------------------------------------------ kData: windows

CORPUS = [5, 3, 0, 4, 6, 7, 2, 0, 1, 4, 6]  # word indices; 0 is </s>; the file ends mid-sentence


def write_corpus(path, words) -> str:
    """A kvfile of WordRecords with these word indices (class fields made up: the data layer only copies them)."""
    with KVFileWriter(str(path)) as writer:
        for k, w in enumerate(words):
            record = pb2().WordRecord(word=f"w{w}", word_index=w, class_index=w % 3,
                                      class_start=10 * w, class_end=10 * w + 7)
            writer.write(f"{k:05d}", record)
    return str(path)


def data_layer(path: str, max_window: int, rows: tuple[int, int] | None = None):
    text = f'name: "data" user_type: "kData" [data_conf] {{ backend: "kvfile" path: "{path}" max_window: {max_window} }}'
    ctx = LayerContext(global_batch=max_window, batch_slice=rows, workspace=str(pathlib.Path(path).parent))
    return build_layer(text, [], batch=max_window, ctx=ctx, dtype=np.float32)


def reference_windows(words: list[int], max_window: int, count: int) -> list[tuple[int, int]]:
    """SINGA's DataLayer: a window's first word is the last word of the window before; it reads on until
    it has read a </s> or max_window more words, from the top again at the end of the file."""
    out, start = [], 0
    for _ in range(count):
        length = 0
        while length < max_window:
            length += 1
            if words[(start + length) % len(words)] == 0:
                break
        out.append((start, length))
        start += length
    return out


def test_windows_run_to_the_end_of_the_sentence_or_max_window_round_the_file(tmp_path, rnnlm):
    path = write_corpus(tmp_path / "words.bin", CORPUS)
    layer = data_layer(path, max_window=4)
    assert layer.out_shape == (6,)
    # by hand: [5 3 | 0] [0 4 6 7 | 2] [2 | 0] [0 1 4 6 | 5] [5 3 | 0] (the 4th wraps: 6 is the file's last)
    expected = [(0, 2), (2, 4), (6, 1), (7, 4), (11, 2), (13, 4)]
    assert reference_windows(CORPUS, 4, 6) == expected
    n = len(CORPUS)
    for k, (start, length) in enumerate(reference_windows(CORPUS, 4, 40)):
        rows = layer.forward([], True)
        assert rows.shape == (4, 6) and rows.dtype == np.float32
        here = [(start + t) % n for t in range(length)]
        after = [(p + 1) % n for p in here]
        np.testing.assert_array_equal(rows[:length, INPUT], [CORPUS[p] for p in here], err_msg=f"window {k}")
        np.testing.assert_array_equal(rows[:length, TARGET], [CORPUS[p] for p in after])
        np.testing.assert_array_equal(rows[:length, CLASS], [CORPUS[p] % 3 for p in after])
        np.testing.assert_array_equal(rows[:length, CLASS_START], [10 * CORPUS[p] for p in after])
        np.testing.assert_array_equal(rows[:length, CLASS_END], [10 * CORPUS[p] + 7 for p in after])
        np.testing.assert_array_equal(rows[:length, VALID], 1)
        np.testing.assert_array_equal(rows[length:], 0, err_msg=f"window {k}: rows past its end")
        # a window ends at a sentence end or after max_window words, and nowhere else
        assert rows[length - 1, TARGET] == 0 or length == 4
        assert not (rows[:length - 1, TARGET] == 0).any()


def test_windows_without_any_sentence_end_are_max_window_long(tmp_path, rnnlm):
    words = [3, 1, 4, 1, 5, 9, 2]
    layer = data_layer(write_corpus(tmp_path / "words.bin", words), max_window=3)
    for k in range(10):
        rows = layer.forward([], True)
        np.testing.assert_array_equal(rows[:, INPUT], [words[(3 * k + t) % 7] for t in range(3)])
        np.testing.assert_array_equal(rows[:, VALID], 1)


def test_a_row_slice_of_the_data_layer_is_those_rows_of_the_whole_window(tmp_path, rnnlm):
    path = write_corpus(tmp_path / "words.bin", CORPUS)
    whole = data_layer(path, max_window=5)
    parts = [data_layer(path, max_window=5, rows=rows) for rows in ((0, 2), (2, 3), (3, 5))]
    for k in range(25):
        rows = whole.forward([], True)
        pieces = [part.forward([], True) for part in parts]
        assert [p.shape[0] for p in pieces] == [2, 1, 2]
        np.testing.assert_array_equal(np.concatenate(pieces), rows, err_msg=f"window {k}")


def test_the_data_layer_resumes_at_the_window_it_stopped_at(tmp_path, rnnlm):
    path = write_corpus(tmp_path / "words.bin", CORPUS)
    first = data_layer(path, max_window=4)
    for _ in range(7):
        first.forward([], True)
    resumed = data_layer(path, max_window=4)
    resumed.load_state(first.state())
    for _ in range(5):
        np.testing.assert_array_equal(resumed.forward([], True), first.forward([], True))


# ------------------------------------------------------------------ gradients

def data_rows(spec) -> np.ndarray:
    """kData's rows from (input, target, class, class start, class end, valid) tuples, as float64."""
    return np.array(spec, dtype=np.float64)


# vocabulary of 8 words in 3 classes: [0, 2), [2, 5), [5, 8)
CLASS_OF = {0: (0, 0, 2), 1: (0, 0, 2), 2: (1, 2, 5), 3: (1, 2, 5), 4: (1, 2, 5), 5: (2, 5, 8), 6: (2, 5, 8),
            7: (2, 5, 8)}


def window(pairs, invalid=()) -> np.ndarray:
    """Rows of (input, target) pairs with the target's class, then invalid rows (all zero but ``input``)."""
    rows = [(w, t, *CLASS_OF[t], 1) for w, t in pairs]
    rows += [(w, 0, 0, 0, 0, 0) for w in invalid]
    return data_rows(rows)


def test_embedding_gradient_adds_up_a_word_used_twice(rnnlm):
    layer = build_layer(f'name: "embedding" user_type: "kEmbedding" srclayers: "data" '
                        f'[embedding_conf] {{ word_dim: 4 vocab_size: 8 }} param {{ name: "w1" {UNIFORM} }}',
                        [(6,)], batch=7)
    rows = window([(2, 5), (5, 2), (2, 7), (0, 3), (6, 0)], invalid=[4, 0])  # word 2 twice; 4 only invalid
    out = layer.forward([rows], True)
    table = layer.params[0].data
    np.testing.assert_array_equal(out[:5], table[[2, 5, 2, 0, 6]])
    np.testing.assert_array_equal(out[5:], 0)
    check_layer_gradients(layer, [rows], check_inputs=[])  # every one of the 32 entries of the table

    grad = np.random.default_rng(1).standard_normal(out.shape)
    layer.params[0].grad[...] = 0
    layer.forward([rows], True)
    assert layer.backward(grad, [False]) == [None]
    g = layer.params[0].grad
    np.testing.assert_allclose(g[2], grad[0] + grad[2])  # both uses (SINGA's Copy kept grad[2] only)
    np.testing.assert_allclose(g[0], grad[3])  # not grad[6]: that row is invalid
    np.testing.assert_array_equal(g[[1, 3, 4, 7]], 0)


def test_embedding_rejects_a_word_outside_its_vocabulary(rnnlm):
    from singa_mpi.errors import DataError

    layer = build_layer('name: "embedding" user_type: "kEmbedding" [embedding_conf] { word_dim: 2 vocab_size: 4 } '
                        f'param {{ name: "w1" {UNIFORM} }}', [(6,)], batch=2)
    with pytest.raises(DataError, match=r"word index 4 outside the vocabulary of 4"):
        layer.forward([data_rows([(4, 1, 0, 0, 2, 1), (1, 2, 0, 0, 2, 1)])], True)


def test_hidden_forward_is_the_recurrence_and_its_gradients_match(rnnlm):
    layer = build_layer(f'name: "hidden" user_type: "kHidden" srclayers: "embedding" param {{ name: "w2" {UNIFORM} }}',
                        [(5,)], batch=6)
    assert type(layer).batch_split_refusal and not type(layer).feature_partitionable
    x = np.random.default_rng(2).standard_normal((6, 5))
    h = layer.forward([x.copy()], True)
    w = layer.params[0].data
    previous = np.zeros(5)
    for t in range(6):
        previous = 1 / (1 + np.exp(-(previous @ w + x[t])))
        np.testing.assert_allclose(h[t], previous, rtol=1e-12)
    check_layer_gradients(layer, [x])  # the input and every entry of the 5x5 weight


class Objective:
    """kLoss as check_layer_gradients sees a layer: forward gives J = Σ -log p(next word) over the valid
    rows (the ``loss`` metric: kLoss's gradients are sums over the window, not means), and backward
    returns kLoss's dJ scaled by the weight check_layer_gradients puts on J."""

    def __init__(self, layer):
        self.layer, self.params = layer, layer.params

    def forward(self, inputs, train):
        self.layer.forward(inputs, train)
        return np.array([self.layer.metrics()["loss"]])

    def backward(self, grad, need):
        scale = float(grad[0])
        grads = self.layer.backward(None, need)
        for param in self.params:
            param.grad[...] *= scale
        return [None if g is None else g * scale for g in grads]


def loss_layer(dim: int = 5, batch: int = 7):
    return build_layer(f'name: "loss" user_type: "kLoss" srclayers: "hidden" srclayers: "data" '
                       f'[loss_conf] {{ nclass: 3 vocab_size: 8 }} '
                       f'param {{ name: "w3" {UNIFORM} }} param {{ name: "w4" {UNIFORM} }}', [(dim,), (6,)], batch=batch)


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_loss_is_the_class_factored_probability_by_hand(rnnlm):
    layer = loss_layer()
    rows = window([(1, 3), (3, 0), (0, 7), (7, 3), (3, 5)], invalid=[0, 0])
    h = np.random.default_rng(4).standard_normal((7, 5))
    p = layer.forward([h, rows], True)
    words, classes = (param.data for param in layer.params)
    assert words.shape == (8, 5) and classes.shape == (3, 5)
    expected = []
    for t, (_, target, cls, first, end, _) in enumerate(rows[:5].astype(int)):
        expected.append(softmax(classes @ h[t])[cls] * softmax(words[first:end] @ h[t])[target - first])
    np.testing.assert_allclose(p[:5, 0], expected, rtol=1e-12)
    np.testing.assert_array_equal(p[5:], 0)
    metrics = layer.metrics()
    assert metrics["loss/count"] == 5
    assert metrics["loss"] == pytest.approx(-np.log(expected).sum(), rel=1e-12)
    report = type(layer).report({"loss": 2.5})
    assert report["ppl"] == pytest.approx(math.exp(2.5))  # SINGA's ppl: 10^(-mean log10 p)
    assert report["ppl"] == pytest.approx(10 ** (2.5 / math.log(10)))


def test_loss_gradients_match_for_its_input_and_both_params(rnnlm):
    layer = loss_layer()
    rows = window([(1, 3), (3, 0), (0, 7), (7, 3), (3, 5)], invalid=[0, 0])  # target 3 twice
    h = np.random.default_rng(5).standard_normal((7, 5))
    check_layer_gradients(Objective(layer), [h, rows], check_inputs=[0])
    # the rows past the window's end: no gradient to h, and no word outside the targets' classes moves
    layer.forward([h, rows], True)
    for param in layer.params:
        param.grad[...] = 0
    dh, drows = layer.backward(None, [True, False])
    assert drows is None
    np.testing.assert_array_equal(dh[5:], 0)
    assert np.abs(layer.params[0].grad).sum(axis=1).all()  # every class has a target here: all 8 words
    layer.metrics()


def test_loss_gradient_with_classes_of_one_word(rnnlm):
    """A class of one word (</s> usually is one): p(word | class) = 1, only the class softmax learns."""
    layer = build_layer(f'name: "loss" user_type: "kLoss" srclayers: "hidden" srclayers: "data" '
                        f'[loss_conf] {{ nclass: 3 vocab_size: 4 }} '
                        f'param {{ name: "w3" {UNIFORM} }} param {{ name: "w4" {UNIFORM} }}', [(3,), (6,)], batch=4)
    rows = data_rows([(1, 0, 0, 0, 1, 1), (0, 2, 1, 1, 3, 1), (2, 3, 2, 3, 4, 1), (3, 0, 0, 0, 0, 0)])
    h = np.random.default_rng(6).standard_normal((4, 3))
    check_layer_gradients(Objective(layer), [h, rows], check_inputs=[0])


# ------------------------------------------------------------------ kLabel: SINGA 0.1's label source of kLoss

def label_layer(batch: int = 7):
    return build_layer('name: "label" user_type: "kLabel" srclayers: "data"', [(6,)], batch=batch)


def test_label_rows_are_the_next_words_class_range_index_and_class(rnnlm):
    """SINGA 0.1's LabelLayer: row t holds word t+1's class start, class end, index and class (kData's
    row t already holds word t+1), and here whether row t lies in the window; no gradient, no params."""
    layer = label_layer()
    assert layer.out_shape == (5,) and not layer.params
    rows = window([(1, 3), (3, 0), (0, 7), (7, 3), (3, 5)], invalid=[4, 0])
    labels = layer.forward([rows], True)
    expected = [(2, 5, 3, 1, 1), (0, 2, 0, 0, 1), (5, 8, 7, 2, 1), (2, 5, 3, 1, 1), (5, 8, 5, 2, 1),
                (0, 0, 0, 0, 0), (0, 0, 0, 0, 0)]
    np.testing.assert_array_equal(labels, expected)
    assert layer.backward(np.ones_like(labels), [True]) == [None]


def test_label_takes_a_data_layer(rnnlm):
    from singa_mpi.layers import LayerConfigError

    with pytest.raises(LayerConfigError, match=r"srclayers\[0\] = \(5,\): expected the kData layer"):
        build_layer('name: "label" user_type: "kLabel" srclayers: "embedding"', [(5,)], batch=3)


def test_loss_on_labels_is_loss_on_data_rows(rnnlm):
    """0.1's kLoss (srclayers: hidden, label) and 0.3's (hidden, data): the same probabilities and gradients."""
    rows = window([(1, 3), (3, 0), (0, 7), (7, 3), (3, 5)], invalid=[0, 0])
    h = np.random.default_rng(7).standard_normal((7, 5))
    on_data = loss_layer()
    on_labels = build_layer(f'name: "loss" user_type: "kLoss" srclayers: "hidden" srclayers: "label" '
                            f'[loss_conf] {{ nclass: 3 vocab_size: 8 }} '
                            f'param {{ name: "w3" {UNIFORM} }} param {{ name: "w4" {UNIFORM} }}', [(5,), (5,)], batch=7)
    for mine, theirs in zip(on_labels.params, on_data.params):
        mine.data[...] = theirs.data
    labels = label_layer().forward([rows], True)
    np.testing.assert_array_equal(on_labels.forward([h, labels], True), on_data.forward([h, rows], True))
    assert on_labels.metrics() == on_data.metrics()
    for layer in (on_labels, on_data):
        for param in layer.params:
            param.grad[...] = 0
    dh_labels, none = on_labels.backward(None, [True, False])
    dh_data, _ = on_data.backward(None, [True, False])
    assert none is None
    np.testing.assert_array_equal(dh_labels, dh_data)
    for mine, theirs in zip(on_labels.params, on_data.params):
        np.testing.assert_array_equal(mine.grad, theirs.grad)
    check_layer_gradients(Objective(on_labels), [h, labels], check_inputs=[0])


def test_loss_refuses_a_second_source_of_another_shape(rnnlm):
    from singa_mpi.layers import LayerConfigError

    with pytest.raises(LayerConfigError, match=r"srclayers\[1\] = \(4,\): expected the kData layer \(rows of 6 "
                                               r"values\) or SINGA 0\.1's kLabel layer \(rows of 5\)"):
        build_layer('name: "loss" user_type: "kLoss" srclayers: "hidden" srclayers: "x" '
                    f'[loss_conf] {{ nclass: 3 vocab_size: 8 }} '
                    f'param {{ name: "w3" {UNIFORM} }} param {{ name: "w4" {UNIFORM} }}', [(5,), (4,)], batch=3)


# ------------------------------------------------------------------ a small job: workers as serially

def small_corpus(rng, sentences: int, words: int = 40) -> list[list[str]]:
    """Sentences of 2-13 words drawn from a Zipf-like vocabulary ``v0``, ``v1``, ...: some longer than a window."""
    weights = 1 / np.arange(1, words + 1)
    weights /= weights.sum()
    return [[f"v{i}" for i in rng.choice(words, size=int(rng.integers(2, 14)), p=weights)] for _ in range(sentences)]


def small_job(create_data, tmp_path, steps: int, vocab: int = 24, nclass: int = 5, word_dim: int = 6) -> pathlib.Path:
    """SINGA's job.conf made small: its data from create_data.py on a synthetic corpus, a small vocabulary,
    classes and word vectors, and a workspace in tmp_path."""
    rng = np.random.default_rng(11)
    train = write_text(tmp_path / "train.txt", small_corpus(rng, 300))
    valid = write_text(tmp_path / "valid.txt", small_corpus(rng, 30))
    data = tmp_path / "data"
    assert create_data.main(["--train", train, "--valid", valid, "--out", str(data), "--vocab-size", str(vocab),
                             "--class-size", str(nclass)]) == 0
    text = SINGA_JOB.read_text()
    for old, new, count in ((r"train_steps:\d+", f"train_steps:{steps}", 1),
                            (r'"examples/rnnlm/train_data.bin"', f'"{data / "train_data.bin"}"', 1),
                            (r'"examples/rnnlm/valid_data.bin"', f'"{data / "valid_data.bin"}"', 1),
                            (r"vocab_size: 3720", f"vocab_size: {vocab}", 2),
                            (r"nclass:100", f"nclass:{nclass}", 1),
                            (r"word_dim: 15", f"word_dim: {word_dim}", 1),
                            (r'workspace: "examples/rnnlm/"', f'workspace: "{tmp_path / "ws"}"', 1)):
        text, made = re.subn(old, new, text)
        assert made == count, (old, made)
    path = tmp_path / "job.conf"
    path.write_text(text)
    return path


def test_a_small_rnnlm_job_trains_on_2_and_3_workers_as_serially(tmp_path, rnnlm, create_data, capsys):
    job = small_job(create_data, tmp_path, steps=8)
    capsys.readouterr()
    # the plan: kHidden's rows are one sequence, whole on one worker; the other layers split the window's rows
    assert cli.main(["plan", str(job), "-n", "3", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    by_layer: dict[str, list[dict]] = {}
    for sub in plan["sublayers"]:
        by_layer.setdefault(sub["origin"], []).append(sub)
    assert len(by_layer["hidden"]) == 1 and by_layer["hidden"][0]["rows"] == [0, 10]
    for name in ("data", "embedding", "loss"):
        subs = sorted(by_layer[name], key=lambda s: s["rows"])
        assert [s["rank"] for s in sorted(subs, key=lambda s: s["rank"])] == [0, 1, 2], name
        assert [tuple(s["rows"]) for s in subs] == [(0, 4), (4, 7), (7, 10)], name
    metrics = check_equivalence(str(job), workers=(2, 3), steps=8)
    assert sorted(metrics) == ["loss"] and len(metrics["loss"]) == 8
    assert all(np.isfinite(metrics["loss"])) and all(0 < loss < 10 for loss in metrics["loss"])


def as_singa_0_1(job: pathlib.Path) -> pathlib.Path:
    """The job in SINGA 0.1's shape: a kLabel layer over the data, and kLoss on hidden and label."""
    text = job.read_text()
    text, made = re.subn(r'(layer\s*\{\s*name:\s*"loss"\s*user_type:\s*"kLoss"\s*srclayers:\s*"hidden"\s*)'
                         r'srclayers:\s*"data"', r'\1srclayers: "label"', text)
    assert made == 1
    text = text.replace('layer{\n  name: "loss"', 'layer { name: "label" user_type: "kLabel" srclayers: "data" }\n'
                                                  'layer{\n  name: "loss"', 1)
    assert '"kLabel"' in text
    path = job.with_name("job_0_1.conf")
    path.write_text(text)
    return path


def test_singa_0_1s_shape_of_the_job_trains_as_0_3s(tmp_path, rnnlm, create_data):
    """kLabel between kData and kLoss changes nothing: the same losses step by step, on 2 workers as serially."""
    job = small_job(create_data, tmp_path, steps=5)
    old = as_singa_0_1(job)
    metrics = check_equivalence(str(old), workers=(2,), steps=5)
    assert len(metrics["loss"]) == 5 and all(np.isfinite(metrics["loss"]))
    np.testing.assert_allclose(metrics["loss"], check_equivalence(str(job), workers=(), steps=5)["loss"], rtol=1e-6)


# ------------------------------------------------------------------ the real thing, as a user runs it

def test_check_passes_singas_job_conf_with_the_plugin_and_names_data_conf_without():
    """In fresh processes, from the repository root, as the README has it."""
    def check(*args):
        return subprocess.run([sys.executable, "-m", "singa_mpi", "check", str(STORED_JOB.relative_to(ROOT)), *args],
                              cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)

    done = check("--plugin", "examples/rnnlm/rnnlm.py")
    assert done.returncode == 0, done.stderr
    assert "job 'rnnlm'" in done.stdout and "batch 10" in done.stdout, done.stdout
    assert "layer type: kData, kEmbedding, kHidden, kLabel, kLoss" in done.stdout, done.stdout
    refused = check()
    lines = refused.stderr.splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert re.fullmatch(r"singa-mpi: error: tests/config/singa_examples/v0\.2\.0/examples/rnnlm/job\.conf:\d+:\d+: "
                        r"layer 'data' \(#0\): \[data_conf\]: no loaded plugin declares this extension: .*--plugin.*",
                        lines[0]), lines[0]


# validation comes before a step's training: 6001 steps validate at 6000 (the loop's) and 6001 (the final model)
STEPS, DISPLAY, VALIDATE = 6001, 1000, 6000


def metrics_of(workspace: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (workspace / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_singa_job_conf_trains_on_the_python_docs_serially_and_on_2_ranks(tmp_path):
    """SINGA's own job.conf with only its data paths changed (the workspace, examples/rnnlm/, is relative
    to the working directory: here tmp_path), trained like a user does: create_data.py, then
    `singa-mpi train --plugin` serially and under mpiexec with 2 ranks."""
    env = mpi_env()
    corpus = tmp_path / "corpus"
    made = subprocess.run([sys.executable, str(EXAMPLE / "create_data.py"), "--python-docs", "--out", str(corpus)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert made.returncode == 0, made.stderr
    assert re.search(r"wrote .*train_data\.bin: \d+ words", made.stdout), made.stdout
    assert "vocabulary: 3720 words in 100 classes" in made.stdout  # job.conf's vocab_size and nclass
    _, records = read_records(corpus / "valid_data.bin")
    assert len(records) > 1000 and max(r.class_end for r in records) <= 3720

    original = SINGA_JOB.read_text()
    assert original == STORED_JOB.read_text()  # SINGA 0.3's job.conf, byte for byte
    job = tmp_path / "job.conf"
    job.write_text(original.replace('"examples/rnnlm/train_data.bin"', f'"{corpus / "train_data.bin"}"')
                           .replace('"examples/rnnlm/valid_data.bin"', f'"{corpus / "valid_data.bin"}"'))
    changed = [line for line in difflib.unified_diff(original.splitlines(), job.read_text().splitlines(), n=0,
                                                     lineterm="") if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ['-    path: "examples/rnnlm/train_data.bin"', f'+    path: "{corpus / "train_data.bin"}"',
                       '-    path: "examples/rnnlm/valid_data.bin"', f'+    path: "{corpus / "valid_data.bin"}"'], changed
    plugin = ["--plugin", str(PLUGIN)]
    checked = subprocess.run([sys.executable, "-m", "singa_mpi", "check", str(job), *plugin], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=False, timeout=120)
    assert checked.returncode == 0, checked.stderr

    # the run: displays and validations more often than SINGA's every 8135 steps (not data: the same training)
    run = tmp_path / "run.conf"
    run.write_text(re.sub(r"(?m)^validate_freq:8135$", f"validate_freq:{VALIDATE}",
                          re.sub(r"(?m)^disp_freq:8135$", f"disp_freq:{DISPLAY}", job.read_text())))
    assert run.read_text().count(f"freq:{VALIDATE}") + run.read_text().count(f"freq:{DISPLAY}") == 2
    train = ["-m", "singa_mpi", "train", str(run), *plugin, "--steps", str(STEPS)]
    serial = subprocess.run([sys.executable, *train], cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
                            timeout=300)
    assert serial.returncode == 0, serial.stdout[-3000:] + serial.stderr[-3000:]
    ranks = subprocess.run(mpiexec_command(2) + [sys.executable, *train, "--workspace", str(tmp_path / "mpi")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert ranks.returncode == 0, ranks.stdout[-3000:] + ranks.stderr[-3000:]

    want = metrics_of(tmp_path / "examples" / "rnnlm")  # the job's own workspace, under the working directory
    got = metrics_of(tmp_path / "mpi")
    displays = [(m["step"], m["phase"]) for m in want]
    assert displays == [(0, "val"), (0, "train")] + [(s, "train") for s in range(DISPLAY, VALIDATE, DISPLAY)] + \
        [(VALIDATE, "val"), (VALIDATE, "train"), (STEPS, "val")], displays  # and the final model's validation
    assert [(m["step"], m["phase"]) for m in got] == displays
    for mine, theirs in zip(want, got):
        assert mine["ppl"] == pytest.approx(math.exp(mine["loss"]), rel=1e-9)
        for key in ("loss", "ppl"):
            assert theirs[key] == pytest.approx(mine[key], rel=1e-5), (mine, theirs)

    train_losses = [m["loss"] for m in want if m["phase"] == "train"]
    val_losses = [m["loss"] for m in want if m["phase"] == "val"]
    # untrained, the class-factored softmax is already near ln 100 + ln(words per class) (ppl ~500):
    # SINGA's classes of about equal frequency make frequent words cheap from the start
    assert 5.5 < val_losses[0] < 7
    assert all(loss < train_losses[0] - 1 for loss in train_losses[1:]), train_losses  # the first is one window
    assert val_losses[-1] < val_losses[0] - 0.3, val_losses  # the validation file's ppl falls by more than a quarter


@pytest.mark.parametrize("job", [SINGA_JOB, ROOT / "tests" / "config" / "singa_examples" / "v0.1.0" / "examples"
                                 / "rnnlm" / "job.conf"], ids=["v0.3", "v0.1"])
def test_plan_cost_times_every_layer_of_singas_job(tmp_path, job):
    """`plan --cost` timed kEmbedding on N(0, 1) floats, which it refused as word indices (exit 3, "word
    index 1 outside the vocabulary of 3720"): rnnlm's layers give the cost model kData's rows."""
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "plan", str(job.relative_to(ROOT)), "-n", "2", "--cost",
                           "--plugin", "examples/rnnlm/rnnlm.py"], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=300, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    timed = [line.split()[0] for line in done.stdout.splitlines() if re.match(r"\w+ +\d+\.\d+ +\d+\.\d+", line)]
    assert {"embedding", "hidden", "loss"} <= set(timed), done.stdout
    assert "predicted step" in done.stdout


def test_embedding_names_a_negative_word_index(rnnlm):
    """The message named the largest index, inside the vocabulary, when a negative one was the culprit."""
    from singa_mpi.errors import DataError

    layer = build_layer('name: "embedding" user_type: "kEmbedding" [embedding_conf] { word_dim: 2 vocab_size: 4 } '
                        f'param {{ name: "w1" {UNIFORM} }}', [(6,)], batch=2)
    with pytest.raises(DataError, match=r"word index -1 outside the vocabulary of 4"):
        layer.forward([data_rows([(-1, 1, 0, 0, 2, 1), (3, 2, 0, 0, 2, 1)])], True)
