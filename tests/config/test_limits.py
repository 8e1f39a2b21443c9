"""Hostile job files end in one line, quickly: not UTF-8, too large, nested too deep, strings too long,
too many layers or unrolled copies.  Each limit is checked before protobuf parses the text, in time
linear in the file, and its error names the limit and where the file crosses it."""
from __future__ import annotations

import pathlib
import sys
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


@pytest.mark.parametrize("head, kind, hint", [
    (b"SINGA-MPI-CHECKPOINT\nlength 9\ncrc32 1\n" + b"\0" * 470 + b"\x89HDF\r\n\x1a\n", "a singa_mpi checkpoint",
     True),
    (b"\x89HDF\r\n\x1a\n\0\0", "an HDF5 file", False),
    (b"\x1f\x8b\x08\x00\xff", "a gzip file", False),
])
def test_a_checkpoint_or_store_given_as_the_job_is_named_as_what_it_is(tmp_path, head, kind, hint):
    """`singa-mpi test WORKSPACE/checkpoint/step600.h5` (the checkpoint where the job goes) said "byte 513:
    not UTF-8 text"."""
    path = tmp_path / "step600.h5"
    path.write_bytes(head)
    with pytest.raises(ConfigError) as err:
        load_job(path)
    inspect = f" (`singa-mpi ckpt inspect {path}` shows what it holds)" if hint else ""
    assert str(err.value) == (f"{path}: {kind}, not a job file: expected the job's configuration, a text file "
                              f"such as conf/digits_mlp.conf{inspect}")


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


class _CountedText(str):
    """A job's text that counts the characters its own methods look at (``looked``)."""

    looked = 0

    def __getitem__(self, key):
        piece = str.__getitem__(self, key)
        _CountedText.looked += len(piece)
        return piece


def _spanning(name: str):
    """``str.<name>(sub, start, end)``, counting the characters from start to end."""
    original = getattr(str, name)

    def method(self, sub, *bounds):
        lo, hi, _ = slice(*(bounds + (None, None))[:2]).indices(len(self))
        _CountedText.looked += max(0, hi - lo)
        return original(self, sub, *bounds)
    return method


def _whole(name: str):
    """``str.<name>(...)``, counting every character of the text."""
    original = getattr(str, name)

    def method(self, *args, **kwargs):
        _CountedText.looked += len(self)
        return original(self, *args, **kwargs)
    return method


for _name in ("count", "find", "rfind", "index", "rindex", "startswith", "endswith"):
    setattr(_CountedText, _name, _spanning(_name))
for _name in ("split", "rsplit", "splitlines", "partition", "rpartition", "strip", "lstrip", "rstrip", "replace",
              "lower", "upper", "encode", "__contains__", "__iter__"):
    setattr(_CountedText, _name, _whole(_name))


class _CountedPattern:
    """The scanner's token pattern, counting the characters each call runs over (``consumed``): to the
    end of each match it returns, from where the call started."""

    def __init__(self, pattern):
        self.pattern, self.consumed = pattern, 0

    def finditer(self, text, pos=0, endpos=sys.maxsize):
        last = pos
        for m in self.pattern.finditer(text, pos, endpos):
            self.consumed += m.end() - last
            last = m.end()
            yield m
        self.consumed += max(0, min(len(text), endpos) - last)

    def _one(self, how: str, text, pos=0, endpos=sys.maxsize):
        m = getattr(self.pattern, how)(text, pos, endpos)
        self.consumed += (m.end() if m else min(len(text), endpos)) - pos
        return m

    def search(self, *args):
        return self._one("search", *args)

    def match(self, *args):
        return self._one("match", *args)

    def fullmatch(self, *args):
        return self._one("fullmatch", *args)

    def __getattr__(self, name):  # findall, split, sub...: the whole text
        def whole(text, *args, **kwargs):
            self.consumed += len(text)
            return getattr(self.pattern, name)(text, *args, **kwargs)
        return whole


def scan_work(text: str, monkeypatch) -> int:
    """What :func:`limits.check_text` does on ``text``, counted without a clock: the lines of
    limits.py it runs, the characters the text's own methods look at, and those the token pattern runs
    over.  (The regular-expression engine's own steps are not counted: its patterns are possessive,
    and the long-token tests above keep a token's cost bounded.)"""
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename != limits.__file__:
            return None
        if event == "line":
            lines += 1
        return tracer

    pattern = _CountedPattern(limits._TOKEN)
    monkeypatch.setattr(limits, "_TOKEN", pattern)
    _CountedText.looked = 0
    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        limits.check_text(_CountedText(text), "x")
    finally:
        sys.settrace(before)
    monkeypatch.setattr(limits, "_TOKEN", pattern.pattern)
    return lines + _CountedText.looked + pattern.consumed


def test_the_scan_is_linear_in_the_file(monkeypatch):
    """Four times the layers, four times the work (a scan quadratic in the file would do 16 times)."""
    layer = 'layer { name: "fc" type: kInnerProduct srclayers: "x" param { init { type: kGaussian std: 0.3 } } }\n'

    def work(count: int) -> int:
        return scan_work("neuralnet {\n" + layer * count + "}\n", monkeypatch)

    small, large = work(250), work(1000)
    assert 3.6 * small < large < 4.4 * small


def test_the_scan_is_linear_in_the_nesting(monkeypatch):
    """Blocks 80 deep cost what as many blocks 20 deep cost (protobuf's own parser was quadratic in
    the nesting: 20,000 nested blocks took 17 s)."""
    def work(depth: int, copies: int) -> int:
        return scan_work("neuralnet {\n" + ("a { " * depth + "} " * depth) * copies + "}\n", monkeypatch)

    shallow, deep = work(20, 40), work(80, 10)  # the same text length, the same number of blocks
    assert 0.9 * shallow < deep < 1.1 * shallow
