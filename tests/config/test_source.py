"""SourceMap: where each field of a text-format job was written (line, column, both 1-based)."""
from __future__ import annotations

import pathlib

import pytest

from singa_mpi.config.load import parse_job
from singa_mpi.config.source import SourceMap

HERE = pathlib.Path(__file__).parent
REPO = HERE.parent.parent


def position_of(text: str, needle: str, occurrence: int = 0) -> tuple[int, int]:
    """(line, col) of the ``occurrence``-th ``needle`` in ``text``: the oracle for SourceMap."""
    start = -1
    for _ in range(occurrence + 1):
        start = text.index(needle, start + 1)
    line = text.count("\n", 0, start) + 1
    return line, start - (text.rfind("\n", 0, start) + 1) + 1


NESTED = """\
name: "nested"
neuralnet {
  layer {
    name: "conv1"
    convolution_conf { num_filters: 8 kernel: 3 }
    param { name: "w1" init { type: kGaussian std: 0.1 } }
    param { name: "b1" init { type: kConstant } }
  }
  layer {
    name: "ip1"
    param { name: "w2" init { type: kUniform low: -1 } }
    param {
      name: "b2"
      init {
        type: kConstant
      }
    }
  }
}
"""


def test_nested_and_repeated_fields_are_counted_per_parent():
    source = SourceMap("nested.conf", NESTED)
    assert source.find("neuralnet") == (2, 1)
    assert source.find("neuralnet", "layer", 1) == position_of(NESTED, "layer", 1)
    assert source.find("neuralnet", "layer", 0, "convolution_conf", "kernel") == position_of(NESTED, "kernel")
    # occurrences count within each parent: layer 1's first param is param 0 again
    assert source.find("neuralnet", "layer", 1, "param", 0, "name") == position_of(NESTED, 'name: "w2"')
    assert source.find("neuralnet", "layer", 1, "param", 1, "init", "type") == position_of(NESTED, "type", 3)
    assert source.find("neuralnet", "layer", 0, "param", 1, "init", "type") == position_of(NESTED, "type", 1)


def test_where_formats_file_line_col():
    source = SourceMap("nested.conf", NESTED)
    line, col = position_of(NESTED, "std")
    assert source.where("neuralnet", "layer", 0, "param", 0, "init", "std") == f"nested.conf:{line}:{col}"


def test_missing_field_falls_back_to_nearest_written_ancestor():
    source = SourceMap("nested.conf", NESTED)
    conv_conf = position_of(NESTED, "convolution_conf")
    assert source.find("neuralnet", "layer", 0, "convolution_conf", "pad") == conv_conf
    assert source.find("neuralnet", "layer", 0, "pooling_conf", "kernel") == position_of(NESTED, "layer")
    assert source.find("neuralnet", "layer", 7, "name") == (2, 1)  # no 8th layer: the neuralnet
    assert source.find("updater", "learning_rate") is None
    assert source.where("updater", "type") == "nested.conf"  # nothing written: the file alone


def test_dotted_names_are_paths_and_the_index_applies_to_the_last_part():
    text = 'layer {\n  store_conf {\n    batchsize: 64\n    batchsize: 16\n  }\n}\n'
    source = SourceMap("f", text)
    assert source.find("layer", "store_conf.batchsize", 1) == (4, 5)
    assert source.find("layer", 0, "store_conf", 0, "batchsize", 1) == (4, 5)
    assert source.find("layer", "store_conf.shape") == (2, 3)


def test_comments_are_skipped_and_hash_inside_strings_is_not_a_comment():
    text = ('# name: "not a field"\n'
            'name: "a#b" train_steps: 5  # disp_freq: 7\n'
            "cluster { workspace: 'ws#1' nworker_groups: 2 }\n"
            '#neuralnet { }\n'
            'disp_freq: 3\n')
    source = SourceMap("f", text)
    assert source.find("name") == (2, 1)
    assert source.find("train_steps") == position_of(text, "train_steps")
    assert source.find("cluster", "nworker_groups") == position_of(text, "nworker_groups")
    assert source.find("disp_freq") == (5, 1)  # the commented-out one on line 2 does not count
    assert source.find("neuralnet") is None
    assert source.value("name") == "a#b"
    assert source.value("cluster", "workspace") == "ws#1"


def test_colon_before_brace_and_angle_brackets():
    text = 'updater:{ type: kSGD learning_rate:< type: kFixed base_lr:0.1 > }\nfixedstep_conf:{step:0 step:6}'
    source = SourceMap("f", text)
    assert source.find("updater", "learning_rate", "base_lr") == position_of(text, "base_lr")
    assert source.find("fixedstep_conf", "step", 1) == position_of(text, "step", 2)
    assert source.spans[("updater", 0, "learning_rate", 0)] == (position_of(text, "<"), position_of(text, ">"))


def test_extension_blocks_are_fields_named_with_brackets():
    text = ('layer {\n  name: "data"\n  [data_conf] {\n    path: "x"\n  }\n'
            '  [ singa.embedding_conf ] { word_dim: 15 }\n  type: kUserLayer\n}\n')
    source = SourceMap("f", text)
    assert source.find("layer", "[data_conf]", "path") == (4, 5)
    assert source.find("layer", "[singa.embedding_conf]", "word_dim") == position_of(text, "word_dim")
    assert source.find("layer", "type") == (7, 3)


def test_lists_one_line_multi_line_and_of_messages():
    text = ('store_conf { shape: [3, 32,\n 32] backend: "kvfile" }\n'
            'include: [kTrain,\n  kTest] exclude: [kVal]\n'
            'layer: [ { name: "a" }, { name: "b" } ]\n'
            'name: "after"\n')
    source = SourceMap("f", text)
    # each item is an occurrence of the field, placed at the item
    assert source.find("store_conf", "shape", 2) == (2, 2)
    assert source.value("store_conf", "shape", 1) == "32"
    assert source.find("store_conf", "backend") == position_of(text, "backend")
    # enum values inside a list are not mistaken for field names
    assert source.find("kTrain") is None and source.find("kTest") is None
    assert source.value("include", 1) == "kTest"
    assert source.value("exclude") == "kVal"
    assert source.find("layer", 1, "name") == position_of(text, 'name: "b"')
    assert source.value("layer", 1, "name") == "b"
    assert source.find("name") == (6, 1)


def test_scalar_values_signs_numbers_and_string_concatenation():
    text = 'a: -1 b: - 2 c: 0x1F d: 5e-05 e: 1.5f f: "x" \'y\' "z" g: -inf h: kGaussian\n'
    source = SourceMap("f", text)
    assert [source.value(k) for k in "abcdefgh"] == ["-1", "-2", "0x1F", "5e-05", "1.5f", "xyz", "-inf", "kGaussian"]
    assert source.find("d") == position_of(text, "d:")  # a hex value does not swallow the next field


def test_crlf_line_endings_and_tabs_count_one_column():
    text = 'name: "x"\r\nneuralnet {\r\n\tlayer { name: "l" }\r\n}\r\n'
    source = SourceMap("f", text)
    assert source.find("neuralnet", "layer", "name") == (3, 10)


def test_enclosing_block_and_field_before_a_position():
    text = 'neuralnet {\n  layer {\n    name: "a"\n  }\n  layer { name: "b"\n'  # second layer unclosed
    source = SourceMap("f", text)
    assert source.enclosing(3, 5) == ("neuralnet", 0, "layer", 0)
    assert source.enclosing(4, 3) == ("neuralnet", 0, "layer", 0)  # on its closing brace
    assert source.enclosing(4, 4) == ("neuralnet", 0)
    assert source.enclosing(6, 1) == ("neuralnet", 0, "layer", 1)  # end of file inside the open layer
    assert source.enclosing(1, 1) == ()
    assert source.field_before(3, 12) == ("neuralnet", 0, "layer", 0, "name", 0)


def _written_paths(message, prefix=()):
    """Every (path, field) protobuf set, with SourceMap-style occurrence indices."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for index, item in enumerate(values):
            name = f"[{field.full_name}]" if field.is_extension else field.name  # as written: [swish_conf]
            path = prefix + (name, index)
            yield path
            if field.message_type is not None:
                yield from _written_paths(item, path)


CONFS = sorted((HERE / "singa03").glob("*.conf")) + sorted((REPO / "conf").glob("*.conf"))


@pytest.mark.parametrize("conf", CONFS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_field_protobuf_parsed_has_a_position(conf):
    text = conf.read_text()
    job = parse_job(text, str(conf)).proto  # with its plugins: their [extensions] are fields too
    source = SourceMap(str(conf), text)
    paths = list(_written_paths(job))
    assert paths
    missing = [p for p in paths if p not in source.positions]
    assert not missing, missing[:5]
    # and nothing extra: the tokenizer saw exactly the fields protobuf saw
    assert set(source.positions) == set(paths)


DAMAGED_BASE = """\
name: "d"  # a comment
updater { type: kSGD learning_rate:< type: kFixed > }
neuralnet {
  layer { name: "a#1" type: kRecordInput store_conf { shape: [3, 4] batchsize: -2 path: 'x' "y" } }
  layer: [ { name: "b" include: [kTrain, kTest] }, { [ext.conf] { v: 0x1F } } ]
}
"""


@pytest.mark.timeout(20)
def test_any_damaged_text_is_indexed_without_error_or_hang():
    """SourceMap also runs on text that does not parse (to place syntax errors): it must always finish."""
    junk = ["}", "{", "[", "]", ":", ";", ",", "-", "<", ">", '"', "'", "#"]
    texts = [DAMAGED_BASE[:cut] for cut in range(len(DAMAGED_BASE))]
    texts += [DAMAGED_BASE[:cut] + bad + DAMAGED_BASE[cut:] for cut in range(0, len(DAMAGED_BASE), 7) for bad in junk]
    for text in texts:
        source = SourceMap("f", text)
        for path, pos in source.positions.items():
            assert len(path) % 2 == 0 and pos >= (1, 1)
