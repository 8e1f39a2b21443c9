"""--keep K: the K newest checkpoints stay, and pruning never takes the one just written nor leaves a
workspace whose only checkpoints are damaged."""
import errno
import os
import shutil

import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from checkpoint_jobs import as_newer_format, job_file, train


def test_keep_never_removes_the_checkpoint_just_written_for_a_newer_damaged_one(tmp_path):
    """A damaged step5.h5 (a stop's checkpoint the disk damaged since): --resume skips it for step 2 and
    writes step 4; --keep 1 kept the damaged step5.h5, the newest by name, and removed step4.h5 and
    step2.h5: the run said `checkpoint .../step4.h5` and left nothing to resume from."""
    conf = job_file(tmp_path, steps=2, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    damaged = checkpoint.checkpoint_path(str(ws), 5)
    shutil.copy(checkpoint.checkpoint_path(str(ws), 2), damaged)
    with open(damaged, "r+b") as f:
        f.truncate(os.path.getsize(damaged) // 2)
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step5\.h5"):
        assert train(conf, ws, resume=True, steps=4, keep=1) == 0
    assert checkpoint.read(checkpoint.checkpoint_path(str(ws), 4)).step == 4  # the one just written stays
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step5\.h5"):
        assert checkpoint.newest_good(str(ws)).step == 4


def test_keep_counts_the_checkpoints_up_to_the_one_written(tmp_path):
    """Files newer than the checkpoint just written (damaged ones a resume skipped) are not counted
    among the K newest, nor removed: the K up to the one written stay."""
    conf = job_file(tmp_path, steps=2, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    damaged = checkpoint.checkpoint_path(str(ws), 9)
    with open(damaged, "wb") as f:
        f.write(b"")
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step9\.h5"):
        assert train(conf, ws, resume=True, steps=8, keep=2) == 0
    assert [step for step, _ in checkpoint.listed(str(ws))] == [9, 8, 6]


def test_resume_stops_at_a_newer_singa_mpi_s_checkpoint_instead_of_overwriting_it(tmp_path):
    """A step4.h5 of a newer format (a newer singa_mpi wrote it) was skipped as damaged: the run resumed
    from step 2 and wrote its own step4.h5 over it, losing the newer run's checkpoint.  Now --resume
    stops in one line naming it (exit 3), and the file stays as it was."""
    conf = job_file(tmp_path, steps=4, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    newer = checkpoint.checkpoint_path(str(ws), 4)
    as_newer_format(newer)
    with open(newer, "rb") as f:
        image = f.read()
    with pytest.raises(checkpoint.DataError) as err:
        train(conf, ws, resume=True, steps=6)
    line = str(err.value)
    assert line.startswith(f"{newer}: checkpoint format {checkpoint.FORMAT_VERSION + 1} is newer than this "
                           f"singa_mpi") and "move it aside" in line and "\n" not in line, line
    with open(newer, "rb") as f:
        assert f.read() == image


@pytest.mark.parametrize("code", [errno.EACCES, errno.EBUSY], ids=["denied", "busy"])
def test_an_old_checkpoint_keep_cannot_remove_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, capsys, code):
    """--keep 1 that could not remove step3.h5 (no permission, a file in use) ended the run, exit 3, though
    the new checkpoint was written whole.  Now one warning naming the file and the OS's reason, said
    once; training goes on and each later checkpoint tries again."""
    conf = job_file(tmp_path, steps=12, extra="checkpoint_freq: 3\n")
    ws = tmp_path / "ws"
    stuck = checkpoint.checkpoint_path(str(ws), 3)
    real_remove = os.remove
    tries = []

    def refusing_remove(path, *args, **kwargs):
        if path == stuck:
            tries.append(path)
            raise OSError(code, os.strerror(code), path)
        real_remove(path, *args, **kwargs)

    monkeypatch.setattr(os, "remove", refusing_remove)
    capsys.readouterr()
    assert train(conf, ws, keep=1) == 0
    out = capsys.readouterr().out
    warned = [line for line in out.splitlines() if "cannot remove" in line]
    assert warned == [f"warning: {stuck}: cannot remove this old checkpoint (--keep 1): {os.strerror(code)}; "
                      f"training goes on, and each later checkpoint tries again"], out
    assert len(tries) == 3  # after steps 6, 9 and 12
    assert [step for step, _ in checkpoint.listed(str(ws))] == [12, 3]
    assert checkpoint.read(checkpoint.checkpoint_path(str(ws), 12)).step == 12
