"""Hostile job files end in one line, quickly: not UTF-8, too large, nested too deep, strings too long,
too many layers or unrolled copies.  Each limit is checked before protobuf parses the text, in time
linear in the file, and its error names the limit and where the file crosses it."""
from __future__ import annotations

import pathlib
import time

import pytest

from singa_mpi.checks.job import validate
from singa_mpi.config import limits
from singa_mpi.config.load import load_job, parse_job
from singa_mpi.config.unroll import MAX_UNROLLED_LAYERS
from singa_mpi.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTE = "(singa_mpi's limit on job files)"
QUICK = 1.0  # seconds: "well under a second" on a loaded CI machine; these take a few milliseconds


def rejected(text: str, path: str = "job.conf") -> tuple[str, float]:
    """The one-line error of parsing ``text``, and how long it took."""
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        parse_job(text, path)
    elapsed = time.perf_counter() - start
    message = str(err.value)
    assert "\n" not in message
    return message, elapsed


# ------------------------------------------------------------------ encoding

def test_invalid_utf8_names_the_byte_and_line(tmp_path):
    conf = tmp_path / "job.conf"
    conf.write_bytes(b'name: "a"\ntrain_steps: 5\nneuralnet { layer { name: "caf\xe9" } }\n')
    with pytest.raises(ConfigError) as err:
        load_job(conf)
    offset = conf.read_bytes().index(b"\xe9") + 1  # counted from 1, as cmp(1) counts bytes
    assert str(err.value).startswith(f"{conf}: byte {offset} (line 3): not UTF-8 text: expected a text file in "
                                     f"UTF-8")
    assert "0xe9" in str(err.value)


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    conf = tmp_path / "job.conf"
    conf.write_bytes(b"\xef\xbb\xbf" + (REPO / "conf" / "digits_mlp.conf").read_bytes())
    assert load_job(conf).proto.name == "digits-mlp"


def test_a_bad_byte_after_a_byte_order_mark_is_counted_in_the_file(tmp_path):
    conf = tmp_path / "job.conf"
    conf.write_bytes(b'\xef\xbb\xbfname: "\xff"\n')
    with pytest.raises(ConfigError, match=rf"^{conf}: byte 11 \(line 1\): not UTF-8 text: .*\(0xff cannot start"):
        load_job(conf)


# ------------------------------------------------------------------ nesting

def test_deep_nesting_is_refused_quickly_at_the_first_block_too_deep():
    message, elapsed = rejected("neuralnet {\n" * 20_000 + "}\n" * 20_000)
    depth = limits.MAX_NESTING + 1
    assert message == f"job.conf:{depth}:11: blocks nested {depth} deep: expected at most {limits.MAX_NESTING} {NOTE}"
    assert elapsed < QUICK


def test_nesting_at_the_limit_reaches_the_parser():
    """The limit itself is allowed: protobuf then says what is wrong with the text."""
    text = "updater {" + " learning_rate {" * (limits.MAX_NESTING - 1) + "}" * limits.MAX_NESTING
    message, _ = rejected(text)
    assert NOTE not in message and "learning_rate" in message


def test_angle_brackets_and_lists_nest_too():
    message, _ = rejected("neuralnet: [" + "< layer " * limits.MAX_NESTING + "]")
    assert f"blocks nested {limits.MAX_NESTING + 1} deep" in message


# ------------------------------------------------------------------ sizes

def test_a_10_mb_string_is_refused_quickly_by_the_file_size():
    message, elapsed = rejected('name: "' + "a" * 10_000_000 + '"\n')
    assert message == (f"job.conf: 10,000,009 characters: expected a job file of at most {limits.MAX_JOB_BYTES:,} "
                       f"bytes (4 MiB, singa_mpi's limit on job files)")
    assert elapsed < QUICK


def test_a_long_string_is_refused_at_its_opening_quote():
    text = 'name: "x"\ntrain_steps: 1\nneuralnet { layer { name: "' + "a\\\"" * 1_000_000 + '" } }\n'
    message, elapsed = rejected(text)
    assert message == (f"job.conf:3:27: string literal of more than {limits.MAX_TOKEN_CHARS:,} characters: "
                       f"expected at most {limits.MAX_TOKEN_CHARS:,} {NOTE}")
    assert elapsed < QUICK


def test_a_long_number_is_refused_too():
    message, _ = rejected("train_steps: " + "9" * (limits.MAX_TOKEN_CHARS + 1))
    assert message.startswith("job.conf:1:14: word or number of more than 65,536 characters")


def test_a_string_of_the_longest_path_is_fine():
    job = parse_job('name: "' + "a" * 4096 + '"')
    assert len(job.proto.name) == 4096


def test_a_large_file_is_refused_before_it_is_read(tmp_path):
    conf = tmp_path / "big.conf"
    with open(conf, "wb") as f:
        f.truncate(limits.MAX_JOB_BYTES + 10)  # sparse: nothing to read if the size is checked first
    with pytest.raises(ConfigError, match=rf"^{conf}: {limits.MAX_JOB_BYTES + 10:,} bytes: expected a job file of "
                                          rf"at most {limits.MAX_JOB_BYTES:,} bytes"):
        load_job(conf)


# ------------------------------------------------------------------ layers

def test_too_many_layers_are_refused_quickly_at_the_first_one_too_many():
    layers = "".join(f'layer {{ name: "l{i}" type: kReLU }}\n' for i in range(limits.MAX_LAYERS + 5))
    message, elapsed = rejected("neuralnet {\n" + layers + "}\n")
    assert message == (f"job.conf:{limits.MAX_LAYERS + 2}:7: layer #{limits.MAX_LAYERS}: more than 10,000 layers "
                       f"in neuralnet: expected at most 10,000 {NOTE}")
    assert elapsed < QUICK


def test_layers_written_as_a_list_count_too():
    message, _ = rejected("neuralnet { layer: [" + "{},\n" * limits.MAX_LAYERS + "{}] }")
    assert f"more than {limits.MAX_LAYERS:,} layers" in message


def test_blocks_named_layer_elsewhere_are_not_layers():
    """Only neuralnet's layers count: a deep ``layer`` inside something else is no layer of the net."""
    text = "updater { " + "learning_rate { } " * (limits.MAX_LAYERS + 1) + "}"
    message, _ = rejected(text)
    assert NOTE not in message  # protobuf's complaint about learning_rate written twice


def test_unrolling_beyond_the_copy_limit_is_refused_at_the_unroll_len():
    text = (REPO / "conf" / "char_rnn.conf").read_text().replace("  unroll_len: 50", "  unroll_len: 100000000", 1)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        validate(parse_job(text, "char.conf"))
    assert time.perf_counter() - start < QUICK
    assert str(err.value).startswith("char.conf:30:3: layer 'onehot' (#1, kOneHot): neuralnet.unroll_len = 100000000: "
                                     f"expected at most {MAX_UNROLLED_LAYERS:,} layers once unrolled")


# ------------------------------------------------------------------ real jobs

@pytest.mark.parametrize("conf", sorted((REPO / "conf").glob("*.conf")), ids=lambda p: p.name)
def test_every_example_job_is_far_below_the_limits(conf):
    text = conf.read_text()
    limits.check_text(text, str(conf))
    assert len(text.encode()) * 100 < limits.MAX_JOB_BYTES
    assert text.count("layer {") * 100 < limits.MAX_LAYERS


def test_the_scan_is_linear_in_the_file():
    """Twice the text, about twice the time (protobuf's own parser was quadratic in the nesting)."""
    layer = 'layer { name: "fc" type: kInnerProduct srclayers: "x" param { init { type: kGaussian std: 0.3 } } }\n'

    def seconds(count: int) -> float:
        text = "neuralnet {\n" + layer * count + "}\n"
        start = time.perf_counter()
        limits.check_text(text, "x")
        return time.perf_counter() - start

    small = min(seconds(2000) for _ in range(3))
    large = min(seconds(8000) for _ in range(3))
    assert large < 8 * small  # 4x the text: linear gives 4x, quadratic 16x
