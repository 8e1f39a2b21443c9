"""What a file holds by its first bytes (singa_mpi.file_kinds): the one rule behind 'a text file, not
a checkpoint' and 'an HDF5 file: expected a mean file'."""
import pytest

from singa_mpi import file_kinds


@pytest.mark.parametrize("head, kind", [
    (b"\x89HDF\r\n\x1a\nrest", "an HDF5 file"),
    (b"\x1f\x8b\x08\x00", "a gzip file"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x02", "an MNIST IDX image file"),
    (b"name: 'mlp'\ntrain_steps: 4\n", file_kinds.TEXT),
    ("caf\u00e9,1,2\n".encode(), file_kinds.TEXT),
    (b"#" * (file_kinds.PROBE - 1) + "\u2603".encode(), file_kinds.TEXT),  # a character cut at the probe's end
    (b"\xff\xfe\x00garbage", None),
    (b"ab\x00cd", None),  # a NUL is no text
    (b"", None),
])
def test_kinds_by_first_bytes(head, kind):
    assert file_kinds.kind_of(head) == kind


def test_a_file_that_cannot_be_read_has_no_kind(tmp_path):
    assert file_kinds.kind_of_file(str(tmp_path / "missing")) is None
    (tmp_path / "job.conf").write_text("name: 'x'\n")
    assert file_kinds.kind_of_file(str(tmp_path / "job.conf")) == file_kinds.TEXT
