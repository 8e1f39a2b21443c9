"""Fuzzing job files: mutations of the example jobs never get past `check` or `train` as a traceback.

Seeds are the jobs that ship (conf/*.conf), SINGA 0.3's jobs (tests/config/singa03) and the small
jobs of tests/nets.py.  A mutation deletes, duplicates or swaps lines and ``name { ... }`` blocks,
puts edge values (0, -1, 2**31, 2**63, nan, inf, 1e38) into numbers, swaps enum values, field names
and strings, inserts random bytes or invalid UTF-8, truncates, nests deeply, writes long strings
or many layers.  The properties:

* ``singa-mpi check JOB`` ends (in-process, within a bound linear in the file's size) with 0, or
  with 2 or 3 and exactly one ``singa-mpi: error:`` line (FILE:LINE for a bad job, quoting only values
  the file holds); nothing escapes;
* a job that `check` accepts is also trained for two steps on synthetic data (``data synthetic
  --like``): a documented exit code, one error line, no traceback, and no silent NaN: a run that
  exits 0 logged finite metrics and wrote a checkpoint of finite params;
* oversized jobs (20,000 levels of nesting, 10 MB strings, 100,000 layers) are accepted or refused
  within time and memory bounds, in a process of their own.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import tempfile

import h5py
import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import example, given
from hypothesis import strategies as st

import fuzz_support as fz
import nets
from singa_mpi.proto import job_pb2

pytestmark = pytest.mark.fuzz
PLUGIN = fz.ROOT / "conf" / "swish_lion.py"  # conf/digits_swish_lion.conf imports it from beside itself


# ------------------------------------------------------------------ seeds

def _nets_jobs() -> dict[str, str]:
    """tests/nets.py's small jobs, reading stores under relative paths (synthetic data goes there)."""
    data = "data/records.h5"
    jobs = {f"nets/mlp-{scheme}": nets.mlp(data, 8, scheme, steps=4)
            for scheme in ("data", "feature", "hybrid", "shared", "transposed", "pipeline")}
    jobs["nets/mlp-dropout"] = nets.mlp_dropout(data, 8, "hybrid", steps=4)
    jobs["nets/mlp-adam"] = nets.mlp(data, 8, "data", steps=4, updater=nets.updater("adam"))
    jobs["nets/convnet"] = nets.convnet("data/images.h5", 4, "hybrid", steps=4, lrn=True, bn=True)
    jobs["nets/rbm"] = nets.rbm(data, 8, "feature", steps=4, test=True)
    jobs["nets/char-rnn"] = nets.char_rnn("data/input.txt", "data/vocab.txt", 4, "data", steps=4, test=True)
    jobs["nets/gru"] = nets.gru_on_records(data, 4, steps=4)
    return jobs


def seed_jobs() -> dict[str, bytes]:
    jobs = {f"conf/{p.name}": p.read_bytes() for p in sorted((fz.ROOT / "conf").glob("*.conf"))}
    jobs.update({f"singa03/{p.name}": p.read_bytes()
                 for p in sorted((fz.ROOT / "tests" / "config" / "singa03").glob("*.conf"))})
    jobs.update({name: text.encode() for name, text in _nets_jobs().items()})
    return jobs


SEEDS = seed_jobs()
# jobs whose two training steps take well under a second on synthetic data (the train property)
QUICK = [name for name in SEEDS if name.startswith("nets/")] + [
    "conf/digits_mlp.conf", "conf/digits_swish_lion.conf", "conf/rbm_digits_1.conf", "conf/mnist_mlp.conf",
    "singa03/csv_textfile.conf", "singa03/mnist_exclude.conf"]

ENUMS = sorted({v.name for e in job_pb2.DESCRIPTOR.enum_types_by_name.values() for v in e.values}
               | {v.name for m in job_pb2.DESCRIPTOR.message_types_by_name.values()
                  for e in m.enum_types for v in e.values})
FIELDS = sorted({f.name for m in job_pb2.DESCRIPTOR.message_types_by_name.values() for f in m.fields})
EDGE_NUMBERS = [b"0", b"-1", b"1", b"2147483647", b"2147483648", b"-2147483649", b"4294967296",
                b"9223372036854775808", b"18446744073709551616", b"nan", b"inf", b"-inf", b"1e38", b"3e38",
                b"-1e38", b"1e-45", b"1e309", b"1e6", b"0.5", b"-0.0", b"0x10", b"1e", b"--1", b"00"]
BAD_BYTES = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x00", b"\xef\xbb\xbf", b"\r"]
ODD_STRINGS = [b'""', b'"data"', b'"loss"', b'"fc1"', b'"/nonexistent/x.h5"', b'"\\xff"', b'"\\777"', b'"a\\"',
               b'"unterminated', b"'single'", '"\u00e9\u4e2d\U0001f600"'.encode(), b'"a\\nb"', b'"../../etc"',
               b'"' + b"x" * 300 + b'"']


# ------------------------------------------------------------------ mutations: (draw, text) -> text

_VALUE = re.compile(rb'\b([A-Za-z_]\w*)(\s*:\s*)("(?:[^"\\\n]|\\.)*"|[^\s{}"#\[\]]+)')
_BLOCK = re.compile(rb"\b\w+\s*\{")
_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def _index(draw, items) -> int:
    return draw(st.integers(0, len(items) - 1))


def _lines(text: bytes) -> list[bytes]:
    return text.split(b"\n")


def delete_line(draw, text: bytes) -> bytes:
    lines = _lines(text)
    del lines[_index(draw, lines)]
    return b"\n".join(lines)


def duplicate_line(draw, text: bytes) -> bytes:
    lines = _lines(text)
    i = _index(draw, lines)
    return b"\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])


def swap_lines(draw, text: bytes) -> bytes:
    lines = _lines(text)
    i, j = _index(draw, lines), _index(draw, lines)
    lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def blocks(text: bytes) -> list[tuple[int, int]]:
    """Spans of ``name { ... }`` blocks (braces counted; the seeds hold no braces inside strings)."""
    spans = []
    for match in _BLOCK.finditer(text):
        depth = 0
        for at in range(match.end() - 1, len(text)):
            depth += {123: 1, 125: -1}.get(text[at], 0)
            if depth == 0:
                spans.append((match.start(), at + 1))
                break
    return spans


def _block(draw, text: bytes) -> tuple[int, int] | None:
    spans = blocks(text)
    return spans[_index(draw, spans)] if spans else None


def delete_block(draw, text: bytes) -> bytes:
    span = _block(draw, text)
    return text if span is None else text[:span[0]] + text[span[1]:]


def duplicate_block(draw, text: bytes) -> bytes:
    span = _block(draw, text)
    return text if span is None else text[:span[1]] + b"\n" + text[span[0]:span[1]] + text[span[1]:]


def move_block(draw, text: bytes) -> bytes:
    """Cut a block and paste it at the start of some line (often inside another block)."""
    span = _block(draw, text)
    if span is None:
        return text
    piece, rest = text[span[0]:span[1]], text[:span[0]] + text[span[1]:]
    starts = [0] + [m.end() for m in re.finditer(rb"\n", rest)]
    at = starts[_index(draw, starts)]
    return rest[:at] + piece + b"\n" + rest[at:]


def _value(draw, text: bytes, accept) -> re.Match | None:
    matches = [m for m in _VALUE.finditer(text) if accept(m.group(3))]
    return matches[_index(draw, matches)] if matches else None


def _replace(text: bytes, match: re.Match, group: int, new: bytes) -> bytes:
    return text[:match.start(group)] + new + text[match.end(group):]


def edge_number(draw, text: bytes) -> bytes:
    match = _value(draw, text, lambda v: v[:1].isdigit() or v[:1] in b"-.")
    return text if match is None else _replace(text, match, 3, draw(st.sampled_from(EDGE_NUMBERS)))


def change_enum(draw, text: bytes) -> bytes:
    match = _value(draw, text, lambda v: v[:1].isalpha() and v not in (b"true", b"false"))
    other = draw(st.sampled_from(ENUMS + ["kNoSuchValue", "true", "0", "-1"])).encode()
    return text if match is None else _replace(text, match, 3, other)


def change_string(draw, text: bytes) -> bytes:
    match = _value(draw, text, lambda v: v[:1] == b'"')
    if match is None:
        return text
    from_file = [m.group(0) for m in _STRING.finditer(text)]  # another layer's name: duplicates, wrong links
    drawn = st.text(max_size=20).map(lambda s: json.dumps(s).encode())
    new = draw(st.one_of(st.sampled_from(ODD_STRINGS), st.sampled_from(from_file), drawn))
    return _replace(text, match, 3, new)


def change_any_value(draw, text: bytes) -> bytes:
    """A value of the wrong kind: a string where a number goes, a bool for an enum, ..."""
    match = _value(draw, text, lambda v: True)
    pool = EDGE_NUMBERS + ODD_STRINGS + [b"true", b"false", b"kReLU", b"{ }", b"[]", b"[1, 2]"]
    return text if match is None else _replace(text, match, 3, draw(st.sampled_from(pool)))


def rename_field(draw, text: bytes) -> bytes:
    match = _value(draw, text, lambda v: True)
    other = draw(st.sampled_from(FIELDS + ["no_such_field", "[ext]", "Layer"])).encode()
    return text if match is None else _replace(text, match, 1, other)


def insert_bytes(draw, text: bytes) -> bytes:
    at = draw(st.integers(0, len(text)))
    junk = draw(st.one_of(st.binary(min_size=1, max_size=12), st.sampled_from(BAD_BYTES)))
    return text[:at] + junk + text[at:]


def truncate(draw, text: bytes) -> bytes:
    return text[:draw(st.integers(0, len(text)))]


def nest(draw, text: bytes, most: int = 200) -> bytes:
    """``name { name { ... } }`` inserted at the start of a line (balanced or not)."""
    depth = draw(st.integers(1, most))
    name = draw(st.sampled_from([b"neuralnet", b"layer", b"x", b"", b"param", b"updater"]))
    closed = draw(st.booleans())
    piece = (name + b" { ") * depth + (b"} " * depth if closed else b"")
    starts = [0] + [m.end() for m in re.finditer(rb"\n", text)]
    at = starts[_index(draw, starts)]
    return text[:at] + piece + b"\n" + text[at:]


def long_string(draw, text: bytes, most: int = 100_000) -> bytes:
    match = _value(draw, text, lambda v: v[:1] == b'"')
    size = draw(st.integers(0, most))
    return text if match is None else _replace(text, match, 3, b'"' + b"a" * size + b'"')


def many_layers(draw, text: bytes, most: int = 50) -> bytes:
    """Copies of one layer under new names: valid-looking layers that feed nothing (dangling)."""
    layers = [span for span in blocks(text) if text[span[0]:span[0] + 5] == b"layer"]
    if not layers:
        return text
    start, end = layers[_index(draw, layers)]
    layer = text[start:end]
    copies = [re.sub(rb'name:\s*"([^"]*)"', b'name: "\\1_%d"' % i, layer, count=1)
              for i in range(draw(st.integers(1, most)))]
    return text[:end] + b"\n" + b"\n".join(copies) + text[end:]


MUTATIONS = [delete_line, duplicate_line, swap_lines, delete_block, duplicate_block, move_block, edge_number,
             change_enum, change_string, change_any_value, rename_field, insert_bytes, truncate, nest,
             long_string, many_layers]
# mutations that keep a job parseable more often than not: for the train property
SEMANTIC = [delete_line, duplicate_line, delete_block, duplicate_block, edge_number, change_enum, change_string,
            many_layers, edge_number, change_enum]


@st.composite
def mutated_jobs(draw, seeds=tuple(SEEDS), mutations=tuple(MUTATIONS), most: int = 3):
    """(seed name, mutation names, mutated text as bytes)."""
    name = draw(st.sampled_from(seeds))
    text, applied = SEEDS[name], []
    for mutate in draw(st.lists(st.sampled_from(mutations), min_size=1, max_size=most)):
        text = mutate(draw, text)
        applied.append(mutate.__name__)
    return name, applied, text


# ------------------------------------------------------------------ mutations of the parsed job

def parsed_seed(name: str) -> job_pb2.JobProto | None:
    """The seed as a JobProto (None for a job with plugin extensions, which plain protobuf cannot read)."""
    job = job_pb2.JobProto()
    try:
        text_format.Parse(SEEDS[name], job)
    except text_format.ParseError:
        return None
    return job


PARSED = {name: job for name in SEEDS if (job := parsed_seed(name)) is not None}
INT_EDGES = [0, 1, -1, 2, 3, 7, 64, 1000, 2**31 - 1, 2**32 - 1, 2**63 - 1]
FLOAT_EDGES = [math.nan, math.inf, -math.inf, 1e38, 3e38, -1e38, 0.0, -1.0, 1e-45, 1e6, 0.5, 2.0]
SCALAR_EDGES = {FieldDescriptor.CPPTYPE_INT32: INT_EDGES, FieldDescriptor.CPPTYPE_INT64: INT_EDGES,
                FieldDescriptor.CPPTYPE_UINT32: INT_EDGES, FieldDescriptor.CPPTYPE_UINT64: INT_EDGES,
                FieldDescriptor.CPPTYPE_FLOAT: FLOAT_EDGES, FieldDescriptor.CPPTYPE_DOUBLE: FLOAT_EDGES,
                FieldDescriptor.CPPTYPE_BOOL: [True, False]}


def slots(message) -> list[tuple[object, FieldDescriptor]]:
    """(message, field) for every field of every message in the job, set or not."""
    found = []
    for field in message.DESCRIPTOR.fields:
        found.append((message, field))
        if field.message_type is None:
            continue
        if field.is_repeated:
            for item in getattr(message, field.name):
                found += slots(item)
        elif message.HasField(field.name):
            found += slots(getattr(message, field.name))
    return found


def _new_value(draw, field: FieldDescriptor, job: job_pb2.JobProto):
    if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
        return draw(st.sampled_from([v.number for v in field.enum_type.values]))
    if field.cpp_type == FieldDescriptor.CPPTYPE_STRING:
        names = [layer.name for layer in job.neuralnet.layer] or ["x"]
        return draw(st.one_of(st.sampled_from(names), st.sampled_from(["", "x", "/nonexistent/x.h5", "a\nb"]),
                              st.text(max_size=12)))
    return draw(st.sampled_from(SCALAR_EDGES[field.cpp_type]))


def edit_field(draw, job: job_pb2.JobProto) -> str:
    """One edit of one field: a scalar set to an edge value (or cleared), a repeated field's element
    deleted, duplicated, swapped or appended.  Returns what it did."""
    candidates = slots(job)
    written = [(m, f) for m, f in candidates if (m.HasField(f.name) if f.has_presence else len(getattr(m, f.name)))]
    message, field = draw(st.sampled_from(written if written and draw(st.integers(0, 3)) else candidates))
    where = f"{message.DESCRIPTOR.name}.{field.name}"
    if field.is_repeated:
        items = getattr(message, field.name)
        action = draw(st.sampled_from(["delete", "duplicate", "swap", "append"] if len(items) else ["append"]))
        i, j = (draw(st.integers(0, len(items) - 1)), draw(st.integers(0, len(items) - 1))) if len(items) else (0, 0)
        if field.message_type is not None:
            if action == "delete":
                del items[i]
            elif action == "duplicate":
                items.add().CopyFrom(items[i])
            elif action == "swap":
                first, second = type(items[i])(), type(items[j])()
                first.CopyFrom(items[i]), second.CopyFrom(items[j])
                items[i].CopyFrom(second), items[j].CopyFrom(first)
            else:
                items.add()
        elif action == "delete":
            del items[i]
        elif action == "swap":
            items[i], items[j] = items[j], items[i]
        else:
            try:
                items.append(items[i] if action == "duplicate" else _new_value(draw, field, job))
            except (ValueError, TypeError):  # out of the field's range: protobuf refuses it itself
                return f"keep {where}"
        return f"{action} {where}[{i}]"
    if field.message_type is not None and not message.HasField(field.name):
        getattr(message, field.name).SetInParent()  # an empty block: every default at once
        return f"add {where} {{ }}"
    if field.message_type is not None or draw(st.integers(0, 5)) == 0:
        message.ClearField(field.name)
        return f"clear {where}"
    value = _new_value(draw, field, job)
    try:
        setattr(message, field.name, value)
    except (ValueError, TypeError):  # out of the field's range: protobuf refuses it before any file does
        return f"keep {where}"
    return f"{where} = {value!r}"


@st.composite
def edited_jobs(draw, seeds=tuple(PARSED), most: int = 2):
    """(seed name, edits, text): the parsed seed with 1..most field edits, printed back as text."""
    name = draw(st.sampled_from(seeds))
    job = job_pb2.JobProto()
    job.CopyFrom(PARSED[name])
    applied = [edit_field(draw, job) for _ in range(draw(st.integers(1, most)))]
    return name, applied, text_format.MessageToString(job).encode()


def any_mutated_job(text_seeds=tuple(SEEDS), mutations=tuple(MUTATIONS), most: int = 3):
    """Text-level mutations (the parser's side) or field edits of the parsed job (the validator's and
    the trainer's side)."""
    return st.one_of(mutated_jobs(text_seeds, mutations, most),
                     edited_jobs(tuple(name for name in text_seeds if name in PARSED)))


def write_job(folder: str, text: bytes) -> str:
    path = os.path.join(folder, "job.conf")
    with open(path, "wb") as f:
        f.write(text)
    shutil.copy(PLUGIN, folder)
    return path


def check_limit(size: int) -> float:
    """Seconds `check` may take on a file of ``size`` bytes: linear in the size."""
    return 10.0 + size * 2e-6


def show(seed: str, applied: list[str], text: bytes) -> str:
    return f"seed {seed}, mutations {applied}; the job (first 3000 bytes):\n{text[:3000]!r}"


# ------------------------------------------------------------------ check

def error_line_problems(err: str, path: str, text: bytes) -> list[str]:
    """A job's error names the file and the line (FILE:LINE, or "(line N)"; a missing field or the
    file's size has none), and quotes only enum values that are in the file (a default the user never
    wrote, such as ``alg = kUserAlg`` for a deleted ``train_one_batch``, misleads)."""
    line = next(row for row in err.splitlines() if row.startswith("singa-mpi: error: "))
    has_line = re.search(re.escape(path) + r":\d+", line) or re.search(r"\(line \d+\)", line)
    whole_file = "missing" in line or re.search(r"[\d,]+ bytes: expected a job file", line)  # no line to point at
    problems = [] if has_line or whole_file else [f"the error does not say FILE:LINE: {line}"]
    if path not in line:
        problems.append(f"the error does not name the job file: {line}")
    for match in re.finditer(r"([\w.\[\]]+) = (k[A-Z]\w*)", line):
        if match.group(2).encode() not in text:
            problems.append(f"the error quotes {match.group(0)}, a value not in the file: {line}")
    return problems


def check_problems(path: str, text: bytes) -> tuple[fz.Outcome, list[str]]:
    """Run `check` on the file; the broken promises of the one-line property."""
    size = len(text)
    outcome = fz.run_in_process(["check", path], check_limit(size))
    problems = fz.one_line_problems(outcome, {0, 2, 3})
    if outcome.code == 2 and not problems:
        problems += error_line_problems(outcome.err, path, text)
    if outcome.seconds > check_limit(size):
        problems.append(f"took {outcome.seconds:.1f}s (bound {check_limit(size):.1f}s)")
    return outcome, problems


def known(label: str, seed: str, old: bytes, new: bytes) -> tuple[str, list[str], bytes]:
    """An explicit case: the issue's mutation ``label`` of a seed (its first ``old`` becomes ``new``)."""
    assert old in SEEDS[seed], (seed, old)
    return seed, [label], SEEDS[seed].replace(old, new, 1)


MLP = "nets/mlp-data"
KNOWN_CHECK_CASES = [  # the classes of bad job files, whatever the draw
    known("invalid UTF-8", "conf/digits_mlp.conf", b"name:", b"\xff\xfename:"),
    known("2,000 levels of nesting", "conf/digits_mlp.conf", b"neuralnet {", b"neuralnet { " * 2000 + b"neuralnet {"),
    known("low: nan in an init", "conf/digits_mlp.conf", b"low: -1", b"low: nan"),
    known("train_one_batch deleted", MLP, b"train_one_batch { alg: kBP }", b""),
    known("init of no type", MLP, b"init { type: kGaussian std: 0.3 }", b"init { }"),
    known("a layer name with a newline", MLP, b'srclayers: "fc2"', b'srclayers: "fc\\n2"'),
]
KNOWN_TRAIN_CASES = [  # accepted by check (or refused in one line), then trained for two steps
    known("low: nan in an init", MLP, b"kGaussian std: 0.3", b"kUniform low: nan high: 1"),
    known("low above high", MLP, b"kGaussian std: 0.3", b"kUniform low: 2 high: 1"),
    known("negative std", MLP, b"std: 0.3", b"std: -1"),
    known("a dangling duplicate layer", MLP, b'layer { name: "act1"',
          b'layer { name: "act1b" type: kReLU srclayers: "fc1" }\nlayer { name: "act1"'),
    known("learning rate 1e6", MLP, b"base_lr: 0.05", b"base_lr: 1e6"),
    known("learning rate 1e38", MLP, b"base_lr: 0.05", b"base_lr: 1e38"),
    known("2**31 outputs", MLP, b"num_output: 16", b"num_output: 2147483647"),
    known("batch of 2**31", MLP, b"batchsize: 8", b"batchsize: 2147483647"),
]


def with_examples(cases):
    """The known cases as hypothesis @example()s of a test taking ``job``."""
    def decorate(test):
        for case in reversed(cases):
            test = example(job=case)(test)
        return test
    return decorate


@fz.timeout(3600)
@fz.fuzz_settings(ci=150, long=1200)
@with_examples(KNOWN_CHECK_CASES)
@given(job=any_mutated_job())
@pytest.mark.slow
def test_check_ends_with_ok_or_one_error_line(job):
    seed, applied, text = job
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-check-") as folder:
        outcome, problems = check_problems(write_job(folder, text), text)
        assert not problems, f"{problems}\n{show(seed, applied, text)}\n{outcome.show()}"


# ------------------------------------------------------------------ train

def non_finite_metrics(workspace: str) -> list[str]:
    path = os.path.join(workspace, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    bad = []
    with open(path) as f:
        for line in f:
            entry = json.loads(line, parse_constant=lambda name: float(name))  # NaN, Infinity
            bad += [f"step {entry.get('step')} {key} = {value}" for key, value in entry.items()
                    if isinstance(value, float) and not math.isfinite(value)]
    return bad


def non_finite_checkpoints(workspace: str) -> list[str]:
    bad = []
    for path in sorted(pathlib.Path(workspace, "checkpoint").glob("step*.h5")):
        with h5py.File(path, "r") as f:
            for name, dataset in f["params"].items():
                if not np.isfinite(dataset[...]).all():
                    bad.append(f"{path.name}: params/{name}")
    return bad


def train_problems(folder: str, path: str) -> tuple[list[fz.Outcome], list[str]]:
    """Synthetic data for the job's inputs, then two training steps: the properties they break."""
    # two classes: every job's loss has at least two outputs
    data = fz.run_subprocess(["data", "synthetic", "--like", path, "--count", "400", "--classes", "2"], folder,
                             limit=60)
    problems = [f"data synthetic: {p}" for p in fz.one_line_problems(data, {0, 2, 3})]
    if data.code != 0:
        return [data], problems
    workspace = os.path.join(folder, "ws")
    train = fz.run_subprocess(["train", path, "--workspace", workspace, "--steps", "2"], folder, limit=120)
    problems += [f"train: {p}" for p in fz.one_line_problems(train, fz.documented_codes())]
    if train.code == 0:  # no silent NaN: a run that succeeds has finite metrics and params
        problems += [f"train exit 0 with non-finite {what}" for what in
                     non_finite_metrics(workspace) + non_finite_checkpoints(workspace)]
    return [data, train], problems


def long_by_request(text: bytes) -> bool:
    """A job that asks for many test or validation batches (beyond a two-step smoke run's bound)."""
    counts = re.findall(rb"\b(?:test_steps|validate_steps)\s*:\s*(\d+)", text)
    return any(int(count) > 20 for count in counts)


@fz.timeout(7200)
@fz.fuzz_settings(ci=20, long=200)
@with_examples(KNOWN_TRAIN_CASES)
@given(job=st.one_of(mutated_jobs(seeds=tuple(QUICK), mutations=tuple(SEMANTIC), most=2),
                     edited_jobs(seeds=tuple(name for name in QUICK if name in PARSED)),
                     edited_jobs(seeds=tuple(name for name in QUICK if name in PARSED))))
@pytest.mark.slow
def test_a_job_check_accepts_trains_or_fails_in_one_line(job):
    seed, applied, text = job
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-train-") as folder:
        path = write_job(folder, text)
        checked = fz.run_in_process(["check", path], check_limit(len(text)))  # its own property is above
        if checked.code != 0 or long_by_request(text):
            return
        outcomes, problems = train_problems(folder, path)
        shown = "\n".join(o.show() for o in outcomes)
        assert not problems, f"{problems}\n{show(seed, applied, text)}\n{shown}"


# ------------------------------------------------------------------ oversized jobs

def oversized(kind: str, size: int) -> bytes:
    base = SEEDS["conf/digits_mlp.conf"]
    if kind == "nesting":
        return base + b"neuralnet { " * size + b"} " * size + b"\n"
    if kind == "string":
        return base.replace(b'name: "digits-mlp"', b'name: "' + b"a" * size + b'"')
    if kind in ("layers", "wide layers"):  # wide: 400-byte names, the most text below a layer limit
        pad = b"w" * 400 if kind == "wide layers" else b""
        layer = b'layer { name: "r%d' + pad + b'" type: kReLU srclayers: "fc1" }\n'
        body = b"".join(layer % i for i in range(size))
        return base.replace(b"neuralnet {", b"neuralnet {\n" + body, 1)
    return base + bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))  # junk


# sizes on both sides of any sensible limit: what is accepted must be checked in linear time too
OVERSIZED = {"nesting": [99, 2_000, 20_000] + ([200_000] if fz.LONG else []),
             "string": [60_000, 1_000_000, 10_000_000] + ([50_000_000] if fz.LONG else []),
             "layers": [5_000, 9_999, 20_000, 100_000] + ([870_000] if fz.LONG else []),
             "wide layers": [5_000, 9_999],
             "junk": [1_000_000] + ([30_000_000] if fz.LONG else [])}


@fz.timeout(3600)
@fz.fuzz_settings(ci=5, long=30)
@given(kind_size=st.sampled_from([(kind, size) for kind, sizes in OVERSIZED.items() for size in sizes]))
@pytest.mark.slow
def test_oversized_jobs_end_within_time_and_memory(kind_size):
    """In a process of its own with 2 GiB of address space: accepted, or refused in one line (a limit
    that names itself), in time linear in the file."""
    kind, size = kind_size
    text = oversized(kind, size)
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-big-") as folder:
        path = write_job(folder, text)
        outcome = fz.run_subprocess(["check", path], folder, limit=check_limit(len(text)) + 10, memory_gib=2.0)
        problems = fz.one_line_problems(outcome, {0, 2})
        assert not problems, f"{kind} x {size} ({len(text):,} bytes): {problems}\n{outcome.show()}"
