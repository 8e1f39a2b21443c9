"""char-rnn's layers: kCharRNN (windows, row streams, wrap-around, state), kRNNLabel, kOneHot on windows,
kCharRNNOutput, kRNNDummy, and SINGA's char-rnn job files through `check`."""
import pathlib
import re

import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi import cli
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.layers.text import reader_period, windows_per_pass
from singa_mpi.proto import job_pb2

CHAR_RNN = pathlib.Path(__file__).parents[1] / "config" / "singa_examples" / "v0.2.0" / "examples" / "char-rnn"
IDENTITY = bytes(range(256))  # a vocabulary whose index of a byte is the byte: windows reveal positions


def layer_conf(text):
    return text_format.Parse(text, job_pb2.LayerProto())


def write(tmp_path, name, blob):
    path = tmp_path / name
    path.write_bytes(blob)
    return str(path)


def reader_conf(tmp_path, text, vocab=IDENTITY, unroll=4, batch=3):
    return layer_conf(f'name: "data" type: kCharRNN char_rnn_conf {{ path: "{write(tmp_path, "in.txt", text)}" '
                      f'vocab_path: "{write(tmp_path, "vocab.txt", vocab)}" unroll_len: {unroll} batchsize: {batch} }}')


def reader(tmp_path, text, vocab=IDENTITY, unroll=4, batch=3, rows=None, workspace=".", stream=(0, 1),
           phase="train"):
    conf = reader_conf(tmp_path, text, vocab, unroll, batch)
    return build_layer(conf, [], batch=batch, ctx=LayerContext(global_batch=batch, batch_slice=rows,
                                                               workspace=workspace, stream=stream, phase=phase))


def expected_window(stream, row, offset, unroll):
    return np.arange(row * stream + offset, row * stream + offset + unroll + 1)


# ------------------------------------------------------------------ kCharRNN

def test_windows_read_each_rows_stream_and_overlap_by_one(tmp_path):
    layer = reader(tmp_path, bytes(range(40)), unroll=4, batch=3)  # M = 13: windows at 0, 4, 8
    assert layer.out_shape == (5,) and layer.ids is None  # nothing read before the first forward
    for offset in (0, 4, 8):
        window = layer.forward([], True)
        assert window.dtype == np.float32 and window.shape == (3, 5)
        for row in range(3):
            np.testing.assert_array_equal(window[row], expected_window(13, row, offset, 4))


def test_wrap_around_never_reads_past_a_rows_stream(tmp_path):
    # M = 11, U = 4: windows [0..4], [4..8]; the next, [8..12], would leave the stream: back to 0
    layer = reader(tmp_path, bytes(range(34)), unroll=4, batch=3)
    offsets, flags = [], []
    for _ in range(7):
        window = layer.forward([], True)
        offsets.append(int(window[0, 0]))
        flags.append(layer.restarted)
        for row in range(3):
            assert row * 11 <= window[row].min() and window[row].max() < (row + 1) * 11
    assert offsets == [0, 4, 0, 4, 0, 4, 0]
    assert flags == [False, True, False, True, False, True, False]  # True: the next batch starts afresh
    assert 33 not in window  # the byte left over by 34 // 3 is never read (B11: SINGA's last row read on)


def test_the_shortest_text_gives_one_window_again_and_again(tmp_path):
    layer = reader(tmp_path, bytes(range(10)), unroll=4, batch=2)  # M = 5 = U + 1
    for _ in range(3):
        np.testing.assert_array_equal(layer.forward([], True), [range(5), range(5, 10)])
        assert layer.restarted and layer.state() == {"offset": 0}


def test_a_resumed_reader_continues_identically(tmp_path):
    first = reader(tmp_path, bytes(range(100)), unroll=3, batch=4)  # M = 25
    for _ in range(5):
        first.forward([], True)
    state = first.state()
    assert state == {"offset": 15}
    second = reader(tmp_path, bytes(range(100)), unroll=3, batch=4)
    second.load_state(state)
    for _ in range(9):  # across a wrap
        np.testing.assert_array_equal(second.forward([], True), first.forward([], True))
        assert second.restarted == first.restarted and second.state() == first.state()


def test_a_state_that_does_not_fit_the_text_is_one_line(tmp_path):
    layer = reader(tmp_path, bytes(range(40)), unroll=4, batch=3)
    layer.load_state({"offset": 12})
    with pytest.raises(DataError, match=r"layer 'data': reader state offset 12: expected a multiple of "
                                         r"unroll_len 4 below 9 \(rows of 13 characters\)"):
        layer.forward([], True)


@pytest.mark.parametrize("splits", [[(0, 1), (1, 3)], [(0, 2), (2, 3)], [(0, 1), (1, 2), (2, 3)]])
def test_partitioned_rows_read_the_serial_characters(tmp_path, splits):
    serial = reader(tmp_path, bytes(range(50)), unroll=4, batch=3)
    parts = [reader(tmp_path, bytes(range(50)), unroll=4, batch=3, rows=rows) for rows in splits]
    for _ in range(6):
        whole = serial.forward([], True)
        np.testing.assert_array_equal(np.concatenate([part.forward([], True) for part in parts]), whole)
        assert all(part.restarted == serial.restarted and part.state() == serial.state() for part in parts)


@pytest.mark.parametrize("groups", [2, 3])
def test_each_worker_group_reads_its_own_contiguous_part_of_the_text(tmp_path, groups):
    """Every group used to read the windows of group 0 (the whole text cut into B streams): G groups
    added no data.  Now G·B streams of M = N // (G·B) bytes, group g's rows streams g·B .. g·B + B - 1."""
    batch, unroll, size = 3, 4, 200
    stream = size // (groups * batch)
    readers = [reader(tmp_path, bytes(range(size)), unroll=unroll, batch=batch, stream=(g, groups))
               for g in range(groups)]
    period = windows_per_pass(size, batch * groups, unroll)
    conf = reader_conf(tmp_path, bytes(range(size)), unroll=unroll, batch=batch)
    assert reader_period(conf, ".", groups) == period < windows_per_pass(size, batch, unroll)
    seen: list[set] = [set() for _ in range(groups)]
    for step in range(2 * period + 1):
        for g, layer in enumerate(readers):
            window = layer.forward([], True)
            for row in range(batch):
                expected = expected_window(stream, g * batch + row, (step % period) * unroll, unroll)
                np.testing.assert_array_equal(window[row], expected)
            seen[g] |= set(window.astype(int).ravel())
            assert layer.restarted == ((step + 1) % period == 0)  # BPTT's restart rule, from the group's period
    part = batch * stream
    for g in range(groups):  # disjoint, contiguous, and together every stream's windows
        assert min(seen[g]) == g * part and max(seen[g]) < (g + 1) * part
    assert len(set.union(*seen)) == sum(map(len, seen))


def test_one_group_and_the_test_phase_read_the_whole_text_as_before(tmp_path):
    serial = reader(tmp_path, bytes(range(60)), unroll=4, batch=3)
    alone = reader(tmp_path, bytes(range(60)), unroll=4, batch=3, stream=(0, 1))
    testing = reader(tmp_path, bytes(range(60)), unroll=4, batch=3, stream=(0, 2), phase="test")
    for _ in range(5):
        whole = serial.forward([], True)
        np.testing.assert_array_equal(alone.forward([], True), whole)
        np.testing.assert_array_equal(testing.forward([], False), whole)  # group 0 alone tests: the whole text


def test_a_text_too_short_for_every_groups_rows_names_the_groups(tmp_path):
    layer = reader(tmp_path, bytes(range(30)), unroll=4, batch=2, stream=(1, 4))  # 8 streams of 3 < 5
    with pytest.raises(DataError, match=r"30 bytes give 4 worker groups x 2 rows of 3 characters: expected at "
                                        r"least unroll_len \+ 1 = 5"):
        layer.forward([], True)


def test_each_group_resumes_at_its_own_position_an_older_state_at_group_0s(tmp_path):
    """A state of G groups: group 0's offset, and ``ahead<g>`` windows more for group g (asynchronous
    groups), wrapped in its streams of 200 // (2 x 3) = 33 (windows at 0, 4, ..., 28: 8 a pass).  An older
    state (no ``groups``) gives every group group 0's offset, wrapped into its shorter streams."""
    def group(g, state):
        layer = reader(tmp_path, bytes(range(200)), unroll=4, batch=3, stream=(g, 2))
        layer.load_state(state)
        return layer
    state = {"offset": 8, "groups": 2, "ahead1": 3}
    first, second = group(0, state), group(1, state)
    np.testing.assert_array_equal(first.forward([], True)[0], expected_window(33, 0, 8, 4))
    np.testing.assert_array_equal(second.forward([], True)[0], expected_window(33, 3, 20, 4))
    assert first.state() == {"offset": 12, "groups": 2, "ahead1": 3}  # the checkpoint adds the groups' steps
    behind = group(1, {"offset": 24, "groups": 2, "ahead1": 3})  # window 6 + 3: the second of the next pass
    np.testing.assert_array_equal(behind.forward([], True)[0], expected_window(33, 3, 4, 4))
    older = group(1, {"offset": 44})  # one group's (200 // 3 = 66-character) streams: window 11 of 8
    np.testing.assert_array_equal(older.forward([], True)[0], expected_window(33, 3, 12, 4))
    assert older.state() == {"offset": 16, "groups": 2}


def test_indices_are_offsets_in_the_vocabulary_file(tmp_path):
    layer = reader(tmp_path, b"abcabcab\ncc", vocab=b"c\nba", unroll=2, batch=1)  # B10: c=0, \n=1, b=2, a=3
    np.testing.assert_array_equal(layer.forward([], True), [[3, 2, 0]])
    np.testing.assert_array_equal(layer.forward([], True), [[0, 3, 2]])


def test_vocabulary_errors_name_the_file_the_byte_and_its_offset(tmp_path):
    with pytest.raises(DataError, match=r"layer 'data': char_rnn_conf.vocab_path .*vocab.txt: byte 0x62 'b' at "
                                        r"offset 3 repeats the byte at offset 1: expected each symbol once"):
        reader(tmp_path, b"abcabc", vocab=b"abcb", unroll=1, batch=1).forward([], True)
    with pytest.raises(DataError, match=r"layer 'data': char_rnn_conf.path .*in.txt: byte 0x0a '\\n' at offset 4 "
                                        r"is not in the vocabulary .*vocab.txt"):
        reader(tmp_path, b"abca\nb", vocab=b"abc", unroll=1, batch=1).forward([], True)
    with pytest.raises(DataError, match=r"char_rnn_conf.vocab_path .*vocab.txt: empty"):
        reader(tmp_path, b"abc", vocab=b"", unroll=1, batch=1).forward([], True)


def test_a_text_too_short_or_missing_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"9 bytes give 2 rows of 4 characters: expected at least "
                                        r"unroll_len \+ 1 = 5 per row"):
        reader(tmp_path, bytes(range(9)), unroll=4, batch=2).forward([], True)
    conf = layer_conf('name: "data" type: kCharRNN char_rnn_conf { path: "nowhere.txt" vocab_path: "v.txt" }')
    layer = build_layer(conf, [], batch=1, ctx=LayerContext(workspace=str(tmp_path)))
    with pytest.raises(DataError, match=r"char_rnn_conf.vocab_path v.txt: no such file .*singa-mpi data text"):
        layer.forward([], True)


@pytest.mark.parametrize("fields,field", [
    ("", "char_rnn_conf"),
    ("char_rnn_conf { vocab_path: 'v' }", "char_rnn_conf.path"),
    ("char_rnn_conf { path: 'p' }", "char_rnn_conf.vocab_path"),
    ("char_rnn_conf { path: 'p' vocab_path: 'v' unroll_len: 0 }", "char_rnn_conf.unroll_len"),
    ("char_rnn_conf { path: 'p' vocab_path: 'v' batchsize: 0 }", "char_rnn_conf.batchsize"),
])
def test_char_rnn_setup_errors_name_the_field(fields, field):
    with pytest.raises(LayerConfigError) as err:
        build_layer(layer_conf(f'name: "data" type: kCharRNN {fields}'), [], batch=1)
    assert err.value.field == field


# ------------------------------------------------------------------ kRNNLabel and kOneHot on windows

def test_rnn_label_copy_t_labels_with_the_next_character(tmp_path):
    window = reader(tmp_path, bytes(range(40)), unroll=4, batch=3).forward([], True)
    for t in range(4):
        label = build_layer(layer_conf(f'name: "{t}#label" type: kRNNLabel srclayers: "data" unroll_index: {t}'),
                            [(5,)], batch=3)
        assert label.out_shape == ()
        out = label.forward([window], True)
        assert label.aux.dtype == np.int32
        np.testing.assert_array_equal(label.aux, window[:, t + 1])
        np.testing.assert_array_equal(out, window[:, t + 1])
        assert label.backward(None, [False]) == [None]


def test_rnn_label_setup_errors():
    with pytest.raises(LayerConfigError, match="unroll_index = 4: expected 0..3"):
        build_layer(layer_conf('name: "l" type: kRNNLabel srclayers: "d" unroll_index: 4'), [(5,)], batch=1)
    with pytest.raises(LayerConfigError, match=r"srclayers = a source of shape \(\): expected a kCharRNN layer"):
        build_layer(layer_conf('name: "l" type: kRNNLabel srclayers: "d"'), [()], batch=1)


def test_onehot_of_a_window_takes_column_unroll_index():
    window = np.array([[0, 3, 1], [2, 2, 4]], np.float32)
    for t in range(3):
        layer = build_layer(layer_conf(f'name: "o" type: kOneHot unroll_index: {t} onehot_conf {{ vocab_size: 5 }}'),
                            [(3,)], batch=2)
        np.testing.assert_array_equal(layer.forward([window], True), np.eye(5)[window[:, t].astype(int)])
    with pytest.raises(LayerConfigError, match=r"unroll_index = 3: expected 0..2: the column of its source's "
                                               r"\(batch, 3\) ids"):
        build_layer(layer_conf('name: "o" type: kOneHot unroll_index: 3 onehot_conf { vocab_size: 5 }'),
                    [(3,)], batch=2)
    one_per_row = build_layer(layer_conf('name: "o" type: kOneHot unroll_index: 7 onehot_conf { vocab_size: 5 }'),
                              [(1,)], batch=2)  # (batch,) ids: unroll_index plays no part
    np.testing.assert_array_equal(one_per_row.forward([np.array([[4], [1]], np.float32)], True), np.eye(5)[[4, 1]])


# ------------------------------------------------------------------ kCharRNNOutput

def output_layer(tmp_path, extra="", batch=2, rows=None):
    vocab = write(tmp_path, "vocab.txt", b"ab\nc")
    conf = layer_conf(f'name: "sampling" type: kCharRNNOutput srclayers: "argsort" '
                      f'char_rnn_conf {{ vocab_path: "{vocab}" {extra} }}')
    return build_layer(conf, [(1,)], batch=batch, ctx=LayerContext(global_batch=batch, batch_slice=rows,
                                                                   workspace=str(tmp_path / "ws")))


def test_char_rnn_output_appends_one_character_per_row_per_call(tmp_path):
    layer = output_layer(tmp_path)
    assert not (tmp_path / "ws").exists()  # setup writes nothing
    x = np.array([[3], [0]], np.float32)
    assert layer.forward([x], False) is x
    layer.forward([np.array([[2], [1]], np.float32)], False)
    assert layer.last == b"\nb" and layer.written == 4
    assert (tmp_path / "ws" / "sampling.txt").read_bytes() == b"ca\nb"  # flushed while open
    layer.close_files()
    named = output_layer(tmp_path, 'path: "out/sampled.txt"')
    named.forward([np.array([[1, 3], [0, 2]], np.float32)], False)  # topk 2: the top choice, column 0
    named.close_files()
    assert (tmp_path / "ws" / "out" / "sampled.txt").read_bytes() == b"ba"


def test_char_rnn_output_errors(tmp_path):
    layer = output_layer(tmp_path)
    with pytest.raises(DataError, match=r"layer 'sampling': index 4.0: expected an integer in 0..3"):
        layer.forward([np.array([[4], [0]], np.float32)], False)
    layer.close_files()
    with pytest.raises(LayerConfigError, match="partition_dim = 0: expected -1"):
        output_layer(tmp_path, rows=(0, 1))
    with pytest.raises(LayerConfigError, match="char_rnn_conf.vocab_path = missing"):
        build_layer(layer_conf('name: "s" type: kCharRNNOutput srclayers: "a"'), [(1,)], batch=1)


# ------------------------------------------------------------------ kRNNDummy

def dummy(extra, batch=4, rows=None, step=0, seed=3):
    conf = layer_conf(f'name: "data" type: kRNNDummy rnn_dummy_conf {{ {extra} }}')
    return build_layer(conf, [], batch=batch, ctx=LayerContext(global_batch=batch, batch_slice=rows, step=step,
                                                               seed=seed))


def test_rnn_dummy_draws_in_range_keyed_by_step_and_rows():
    integer = dummy("shape: 2 integer: true low: 3 high: 7", batch=50)
    values = integer.forward([], False)
    assert values.shape == (50, 2) and values.dtype == np.float32
    assert set(np.unique(values)) == {3, 4, 5, 6}
    real = dummy("shape: 3 low: -0.5 high: 0.25")
    drawn = real.forward([], False)
    assert drawn.min() >= -0.5 and drawn.max() < 0.25 and np.any(drawn != np.floor(drawn))
    np.testing.assert_array_equal(real.forward([], False), drawn)  # the same step: the same values
    assert not np.array_equal(dummy("shape: 3 low: -0.5 high: 0.25", step=1).forward([], False), drawn)
    parts = [dummy("shape: 3 low: -0.5 high: 0.25", rows=rows).forward([], False) for rows in [(0, 1), (1, 4)]]
    np.testing.assert_array_equal(np.concatenate(parts), drawn)


def test_rnn_dummy_feedback_is_the_output_while_set():
    layer = dummy("shape: 1 integer: true low: 0 high: 101 dynamic_srclayer: 'argsort'", batch=2)
    layer.feedback = np.array([[7.0], [9.0]])
    np.testing.assert_array_equal(layer.forward([], False), [[7], [9]])
    with pytest.raises(DataError, match=r"feedback of shape \(3,\): expected 2 rows of shape \(1,\)"):
        layer.feedback = np.zeros(3)
        layer.forward([], False)
    layer.feedback = None
    assert layer.forward([], False).max() < 101


@pytest.mark.parametrize("extra,field", [("low: 0 high: 1", "rnn_dummy_conf.shape"),
                                         ("shape: 0 low: 0 high: 1", "rnn_dummy_conf.shape"),
                                         ("shape: 1 low: 2 high: 2", "rnn_dummy_conf.high")])
def test_rnn_dummy_setup_errors(extra, field):
    with pytest.raises(LayerConfigError) as err:
        dummy(extra)
    assert err.value.field == field


# ------------------------------------------------------------------ SINGA's char-rnn files through `check`

def edited(tmp_path, name, *replacements):
    text = (CHAR_RNN / name).read_text()
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def check_error(path, capsys):
    assert cli.main(["check", path]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_singa_char_rnn_job_passes_check(capsys):
    assert cli.main(["check", str(CHAR_RNN / "job.conf")]) == 0, capsys.readouterr().err


def test_rnn_label_needs_a_char_rnn_source(tmp_path, capsys):
    label = 'type: kRNNLabel\n    srclayers: "data"\n    unroll_conn_type: kUnrollOneToAll'
    path = edited(tmp_path, "job.conf", (label, 'type: kRNNLabel\n    srclayers: "ip1"'))  # copy t of ip1
    assert re.fullmatch(rf"singa-mpi: error: {re.escape(path)}:\d+:\d+: layer '0#label' \(#2, kRNNLabel\): "
                        r"srclayers\[0\] = '0#ip1' \(kInnerProduct\): expected a kCharRNN layer, whose windows of "
                        r"characters kRNNLabel labels with the next character", check_error(path, capsys))


def sample_with_job_fields(tmp_path, *more):
    """sample.conf as SINGA ran it (by `-test`: a test-only job, without train_steps or an updater; its net
    has no loss to train on), its kOneHot's vocab_size written."""
    return edited(tmp_path, "sample.conf",
                  ('srclayers: "data"\n  }', 'srclayers: "data"\n    onehot_conf { vocab_size: 101 }\n  }'), *more)


def test_singa_sample_conf_layers_pass_check(tmp_path, capsys):
    assert cli.main(["check", sample_with_job_fields(tmp_path)]) == 0, capsys.readouterr().err


def test_rnn_dummy_names_a_layer_of_its_phase(tmp_path, capsys):
    path = sample_with_job_fields(tmp_path, ('dynamic_srclayer: "argsort"', 'dynamic_srclayer: "argsrot"'))
    assert re.search(r":\d+:\d+: layer 'data' \(#0, kRNNDummy\): rnn_dummy_conf.dynamic_srclayer = 'argsrot': "
                     r"expected the name of a layer of the same phase", check_error(path, capsys))


@pytest.mark.parametrize("steps,message", [
    (60, r"layer 'data' \(#0, kCharRNN\): char_rnn_conf.unroll_len = 60: expected 50, the time steps of the "
         r"layers reading it"),
    (40, r"layer '41#onehot' \(#1, kOneHot\): unroll_index = 41: expected 0..40: .* \(a kCharRNN source gives "
         r"char_rnn_conf.unroll_len \+ 1\)"),
])
def test_the_readers_unroll_len_must_be_the_nets(tmp_path, capsys, steps, message):
    reader_unroll = "batchsize: 50\n      unroll_len: "
    path = edited(tmp_path, "job.conf", (reader_unroll + "50", f"{reader_unroll}{steps}"))
    assert re.search(rf"^singa-mpi: error: {re.escape(path)}:\d+:\d+: {message}", check_error(path, capsys))
