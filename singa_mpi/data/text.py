"""Character-level text data for char-rnn: a corpus file and its vocabulary (SINGA's examples/char-rnn).

    singa-mpi data text --out data/text                 # the Python standard library's own source
    singa-mpi data text --out data/text a.txt b.txt     # or any files, concatenated in the given order

writes ``input.txt`` (the text, bytes as they are) and ``vocab.txt``: every distinct byte of the text
once, sorted, with no separator, as SINGA's data.py writes it (SINGA left the order to a Python
set; sorted makes the file the same on every machine).  A symbol's index is its position in the
vocabulary file, 0-based (SINGA 0.3 started at -1 on current compilers: bug B10).

The default corpus is the ``.py`` files of the folder of the ``os`` module (every Python has them),
sorted by name, keeping only files of plain ASCII text (tab, newline and the printable characters):
a vocabulary of at most 97 symbols, so SINGA's own job.conf (``vocab_size: 101``) runs on it unchanged.
"""
from __future__ import annotations

import glob
import os
from typing import Sequence

import numpy as np

from singa_mpi.data import memory
from singa_mpi.data.convert import atomic_path, check_folder
from singa_mpi.errors import DataError

INPUT_FILE, VOCAB_FILE = "input.txt", "vocab.txt"
DEFAULT_MAX_BYTES = 2_000_000
_PLAIN = frozenset(b"\t\n" + bytes(range(32, 127)))  # what a default-corpus file may contain


def show_byte(value: int) -> str:
    """A byte for a message: ``0x0a '\\n'``."""
    return f"0x{value:02x} {chr(value)!r}"


def stdlib_sources() -> list[str]:
    """The plain-ASCII ``.py`` files next to the ``os`` module, sorted by name (no dependence on
    directory order)."""
    folder = os.path.dirname(os.__file__)
    files = sorted(glob.glob(os.path.join(folder, "*.py")))
    return [path for path in files if _is_plain(path)]


def _is_plain(path: str) -> bool:
    with open(path, "rb") as f:
        return _PLAIN.issuperset(f.read())


def collect_text(files: Sequence[str], max_bytes: int) -> bytes:
    """The files' bytes concatenated in order, cut at ``max_bytes``."""
    if max_bytes < 1:
        raise DataError(f"--max-bytes {max_bytes}: expected a positive number of bytes")
    parts, size = [], 0
    for path in files:
        if size >= max_bytes:
            break
        try:
            with open(path, "rb") as f:
                blob = f.read(max_bytes - size)
        except OSError as err:
            raise DataError(f"{path}: cannot read it ({err.strerror or err})") from None
        parts.append(blob)
        size += len(blob)
    text = b"".join(parts)
    if not text:
        raise DataError(f"{', '.join(files) or 'no files'}: no text to write: expected at least one byte")
    return text


def write_text_corpus(out_dir: str, files: Sequence[str] | None = None,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
    """Write ``out_dir``/input.txt and ``out_dir``/vocab.txt; returns their paths.

    ``files`` None or empty: the standard library's source (see the module docstring)."""
    check_folder(out_dir, f"the text and its vocabulary ({INPUT_FILE}, {VOCAB_FILE})")
    text = collect_text(list(files) if files else stdlib_sources(), max_bytes)
    vocab = bytes(sorted(set(text)))
    written = []
    for name, blob in ((INPUT_FILE, text), (VOCAB_FILE, vocab)):
        path = os.path.join(out_dir, name)
        with atomic_path(path, "the text" if name == INPUT_FILE else "the vocabulary") as tmp, open(tmp, "wb") as f:
            f.write(blob)
        written.append(path)
    return written


# ------------------------------------------------------------------ reading (the char-rnn layers)

def read_bytes(path: str, what: str) -> bytes:
    """The bytes of the file ``path`` (or of the text a script holds, for a ``memory:`` path);
    DataError naming ``what`` when it cannot be read."""
    if memory.is_memory_path(path):
        return memory.held_bytes(path, what)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise DataError(f"{what} {path}: cannot read it ({err.strerror or err})") from None


def read_vocab(path: str, what: str) -> bytes:
    """The vocabulary file: each byte one symbol, its index its offset.  DataError naming ``what``,
    the file, the byte and both offsets if a byte repeats (its index would be ambiguous)."""
    vocab = read_bytes(path, what)
    if not vocab:
        raise DataError(f"{what} {path}: empty: expected one byte per symbol")
    first: dict[int, int] = {}
    for offset, value in enumerate(vocab):
        if value in first:
            raise DataError(f"{what} {path}: byte {show_byte(value)} at offset {offset} repeats the byte at "
                            f"offset {first[value]}: expected each symbol once (its index is its offset)")
        first[value] = offset
    return vocab


def encode(text: bytes, vocab: bytes, what: str, path: str, vocab_path: str) -> np.ndarray:
    """Each byte of ``text`` as its index in ``vocab``.  # (len(text),) int32

    DataError naming the file, the first byte missing from the vocabulary and its offset."""
    table = np.full(256, -1, np.int32)
    table[np.frombuffer(vocab, np.uint8)] = np.arange(len(vocab), dtype=np.int32)
    ids = table[np.frombuffer(text, np.uint8)]
    missing = np.flatnonzero(ids < 0)
    if missing.size:
        offset = int(missing[0])
        raise DataError(f"{what} {path}: byte {show_byte(text[offset])} at offset {offset} is not in the "
                        f"vocabulary {vocab_path}: expected a vocabulary holding every byte of the text "
                        f"(`singa-mpi data text` writes both)")
    return ids
