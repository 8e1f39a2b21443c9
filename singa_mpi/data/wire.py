"""The fields of many serialized protobuf messages at once, read with numpy from the bytes.

A kvfile's values are serialized ``RecordProto``s (a DataShard's, ``Record``s wrapping one).  Parsing
them one by one costs a protobuf parse and a Python object per record: about a second per GiB.  The
checks before training need a few fields of every record (the label; where the float ``data`` lie),
and :func:`walk` reads those for all records together: one numpy pass per field position over the
records (a record holds a handful of fields: its shape's dimensions, a label, the values), not one
Python step per record.

Wire format (protobuf's encoding): a message is a sequence of fields, each a varint tag
``field_number << 3 | wire_type`` then a value: wire type 0 a varint, 1 eight bytes, 2 a varint length
and that many bytes, 5 four bytes.  Varints are little-endian groups of 7 bits, the high bit set on
every byte but the last.  A field that occurs twice takes its last value (a message field would merge,
a packed repeated field concatenate: callers fall back for those, ``count`` tells).

:func:`walk` returns None for anything it does not read exactly as protobuf would (a wire type other
than 0, 1, 2 and 5, a field of two wire types, a varint of more than 10 bytes, a field running past
its message, more than ``max_fields`` fields in a message): the caller then parses record by record,
which also words the error for a damaged record.
"""
from __future__ import annotations

import dataclasses

import numpy as np

VARINT, FIXED64, DELIMITED, FIXED32 = 0, 1, 2, 5
_FIXED = {FIXED64: 8, FIXED32: 4}
MAX_FIELDS = 64  # fields per message walked before giving up (unpacked repeated values: parse one by one)


@dataclasses.dataclass
class Field:
    """One field number's last occurrence in each message: ``value`` (varint: its value; else the
    offset of its bytes in the buffer), ``length`` (wire type 2: its byte count) and ``count``, how
    many times it occurred (0: absent; then value and length are 0)."""

    wire: int
    value: np.ndarray  # (messages,) uint64 for a varint, else int64 offsets
    length: np.ndarray  # (messages,) int64
    count: np.ndarray  # (messages,) int32


def _varints(raw: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(values uint64, positions after them) of the varints starting at ``at``; None if one runs past
    ``end`` or is longer than 10 bytes."""
    if (at >= end).any():
        return None
    first = raw[at]
    if (first < 0x80).all():  # the usual case: every one a byte (tags, small labels and lengths)
        return first.astype(np.uint64), at + 1
    value = np.zeros(len(at), np.uint64)
    size = np.zeros(len(at), np.int64)
    going = np.arange(len(at))
    for k in range(10):
        where = at[going] + k
        if (where >= end[going]).any():
            return None
        byte = raw[where]
        value[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        last = byte < 0x80
        size[going[last]] = k + 1
        going = going[~last]
        if not going.size:
            return value, at + size
    return None


def walk(buffer, offsets: np.ndarray, lengths: np.ndarray, max_fields: int = MAX_FIELDS) -> dict[int, Field] | None:
    """Every field of the messages at ``offsets`` (``lengths`` bytes each) of ``buffer``, by number;
    None where protobuf's reading might differ (see the module docstring)."""
    raw = np.frombuffer(buffer, np.uint8)
    count = len(offsets)
    position, end = np.asarray(offsets, np.int64).copy(), np.asarray(offsets, np.int64) + lengths
    fields: dict[int, Field] = {}
    for _ in range(max_fields + 1):
        live = np.flatnonzero(position < end)
        if not live.size:
            return fields
        read = _varints(raw, position[live], end[live])
        if read is None:
            return None
        tag, after = read
        numbers, wires = (tag >> np.uint64(3)).astype(np.int64), (tag & np.uint64(7)).astype(np.int64)
        if (numbers == 0).any() or (tag >> np.uint64(32)).any():
            return None  # field number 0, or one above 2**29: no message holds these
        keys = numbers * 8 + wires
        for key in [keys[0]] if (keys == keys[0]).all() else np.unique(keys):  # records alike: one field
            number, wire = divmod(int(key), 8)
            pick = keys == key
            rows, start = live[pick], after[pick]
            field = fields.setdefault(number, Field(wire, np.zeros(count, np.uint64 if wire == VARINT else np.int64),
                                                    np.zeros(count, np.int64), np.zeros(count, np.int32)))
            if field.wire != wire:
                return None
            if wire == VARINT:
                got = _varints(raw, start, end[rows])
                if got is None:
                    return None
                field.value[rows], position[rows] = got
            elif wire == DELIMITED:
                got = _varints(raw, start, end[rows])
                if got is None:
                    return None
                size, at = got[0].astype(np.int64), got[1]
                if (size < 0).any() or (at + size > end[rows]).any():
                    return None
                field.value[rows], field.length[rows], position[rows] = at, size, at + size
            elif wire in _FIXED:
                if (start + _FIXED[wire] > end[rows]).any():
                    return None
                field.value[rows], position[rows] = start, start + _FIXED[wire]
            else:
                return None  # groups (3, 4) and the unused wire types
            field.count[rows] += 1
    return None


def int32_of(values: np.ndarray) -> np.ndarray:
    """Varint values of an ``int32`` field as protobuf reads them: the low 32 bits, signed."""
    return (values & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
