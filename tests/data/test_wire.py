"""Fields of many serialized messages read together with numpy: the same as protobuf's own parse, or
None (the caller parses record by record) where the bytes are not as protobuf's writers put them."""
import numpy as np
import pytest

from singa_mpi.data import wire
from singa_mpi.proto import job_pb2


def messages(blobs: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The blobs back to back (after a byte of padding, so offsets do not start at 0)."""
    lengths = np.array([len(b) for b in blobs], np.int64)
    offsets = 1 + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return b"\xff" + b"".join(blobs), offsets, lengths


def random_records(rng, count: int) -> list[job_pb2.RecordProto]:
    records = []
    for i in range(count):
        record = job_pb2.RecordProto(shape=[int(s) for s in rng.integers(1, 2000, rng.integers(0, 4))])
        if rng.random() < 0.8:  # labels of every varint length, negative ones (10 bytes) included
            record.label = int(rng.choice([0, 1, 127, 128, 2 ** 31 - 1, -1, -2 ** 31, rng.integers(-2 ** 31, 2 ** 31)]))
        if rng.random() < 0.5:
            record.pixel = rng.integers(0, 256, rng.integers(0, 300)).astype(np.uint8).tobytes()
        if rng.random() < 0.5:
            record.data.extend(rng.normal(size=rng.integers(0, 40)).tolist())
        records.append(record)
    return records


@pytest.mark.parametrize("count", [0, 1, 2, 300])
def test_walk_reads_what_protobuf_parses(count):
    records = random_records(np.random.default_rng(count), count)
    buffer, offsets, lengths = messages([r.SerializeToString() for r in records])
    fields = wire.walk(buffer, offsets, lengths)
    assert fields is not None
    labels = fields.get(2)
    got = wire.int32_of(labels.value) if labels is not None else np.zeros(count, np.int32)
    np.testing.assert_array_equal(got, [r.label for r in records])
    for number, name in ((3, "pixel"), (4, "data")):
        field = fields.get(number)
        for k, record in enumerate(records):
            at, size = (int(field.value[k]), int(field.length[k])) if field is not None else (0, 0)
            held = buffer[at:at + size]
            expected = record.pixel if name == "pixel" else np.asarray(record.data, np.float32).tobytes()
            assert held == expected, (k, name)
    if count:
        shapes = fields.get(1)
        np.testing.assert_array_equal(shapes.count if shapes is not None else 0, [len(r.shape) for r in records])


def test_a_field_given_twice_keeps_the_last_value_and_counts_both():
    blob = bytes([0x10, 5]) + bytes([0x10, 0x96, 0x01])  # label 5, then label 150
    assert job_pb2.RecordProto.FromString(blob).label == 150
    fields = wire.walk(*messages([blob]))
    assert int(fields[2].value[0]) == 150 and fields[2].count[0] == 2


@pytest.mark.parametrize("blob", [
    bytes([0x10]),  # a varint cut short
    bytes([0x1A, 5, 1, 2]),  # bytes running past the message
    bytes([0x10] + [0xFF] * 10 + [1]),  # a varint of 11 bytes
    bytes([0x0B, 0x0C]),  # a group
    bytes([0x07, 1]),  # wire type 7
    bytes([0x00, 1]),  # field number 0
    bytes([0x10, 1, 0x12, 0]),  # field 2 as a varint and as bytes
    bytes([0x25, 0, 0, 0]),  # four bytes cut to three
], ids=["short varint", "long bytes", "11-byte varint", "group", "wire 7", "field 0", "two wire types", "short fixed32"])
def test_what_it_cannot_read_exactly_is_none(blob):
    assert wire.walk(*messages([job_pb2.RecordProto(label=3).SerializeToString(), blob])) is None


def test_more_fields_than_the_limit_is_none():
    blob = job_pb2.RecordProto(shape=list(range(1, 10))).SerializeToString()
    assert wire.walk(*messages([blob]), max_fields=9) is not None
    assert wire.walk(*messages([blob]), max_fields=8) is None
