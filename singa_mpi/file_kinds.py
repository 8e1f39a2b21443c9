"""What a file holds, by its first bytes: for the one-line error when a command is given a file of
another kind than it reads (a job file where a checkpoint goes, a data store where a mean file goes),
instead of calling the file damaged."""
from __future__ import annotations

PROBE = 4096  # bytes read: enough to tell text from binary

_MAGIC = ((b"\x89HDF\r\n\x1a\n", "an HDF5 file"), (b"\x1f\x8b", "a gzip file"),
          (b"\x00\x00\x08\x03", "an MNIST IDX image file"), (b"\x00\x00\x08\x01", "an MNIST IDX label file"),
          (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"))
TEXT = "a text file"
CHECKPOINT_SEAL = b"SINGA-MPI-CHECKPOINT\n"  # a checkpoint's first bytes (its user block: checkpoints/hdf5.py)


def kind_of_job_candidate(head: bytes) -> str | None:
    """What a file given as a job holds when it is no text at all: a singa_mpi checkpoint (its seal comes
    before HDF5's signature) or one of :func:`kind_of`'s kinds; None for text or bytes of no known kind
    (the parser then names what is wrong, where)."""
    if head.startswith(CHECKPOINT_SEAL):
        return "a singa_mpi checkpoint"
    kind = kind_of(head)
    return None if kind == TEXT else kind


def kind_of(head: bytes) -> str | None:
    """The kind of a file whose first bytes are ``head`` (at most :data:`PROBE` of them): an HDF5, gzip,
    IDX or image file by its magic number, :data:`TEXT` when it is printable UTF-8 (a character cut at
    the end of ``head`` aside); None for an empty file or bytes of no kind known here."""
    head = head[:PROBE]
    found = next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)
    if found or not head:
        return found
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not only a character cut at the end of the bytes read
            return None
        text = head[:err.start].decode("utf-8")
    return TEXT if all(c.isprintable() or c in "\t\r\n" for c in text) else None


def kind_of_file(path: str) -> str | None:
    """:func:`kind_of` the file at ``path`` (None where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return kind_of(f.read(PROBE))
    except OSError:
        return None
