"""Setup's warnings are said once per job: not once per rank, nor once per reading of a store."""
import subprocess
import sys
import warnings

import pytest

from checkpoint_jobs import ROOT
from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi.launcher import said_once

TORN = "ignoring a torn record"
IGNORED_GPU = "gpu: [0] ignored"


def test_the_union_keeps_rank_order_and_says_each_message_once():
    first, second, third = (UserWarning, "a"), (UserWarning, "b"), (RuntimeWarning, "c")
    assert said_once.union([[first, second], [second, third], [first]]) == [first, second, third]


def test_what_was_said_is_ignored_for_the_rest_of_the_run_and_the_callers_filters_decide():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with said_once.recorded() as said:
            warnings.warn("torn record at byte 9")
            warnings.warn("gpu ignored")
        assert shown == []  # kept, not shown
        warnings.filterwarnings("ignore", message="gpu")  # the caller's own choice
        said_once.say(said)
        warnings.warn("torn record at byte 9")  # read again for training: already said
        warnings.warn("torn record at byte 9 and more")  # another message: said
    assert [str(w.message) for w in shown] == ["torn record at byte 9", "torn record at byte 9 and more"]


@pytest.fixture(scope="module")
def torn_job(tmp_path_factory):
    """The default job on a kvfile store whose last record is torn, with SINGA's `gpu:` field."""
    folder = tmp_path_factory.mktemp("said_once")
    subprocess.run([sys.executable, "-m", "singa_mpi", "data", "digits", "--backend", "kvfile",
                    "--out", str(folder / "kv")], cwd=ROOT, env=mpi_env(), check=True, capture_output=True)
    train = folder / "kv" / "train.bin"
    train.write_bytes(train.read_bytes()[:-30])
    text = (ROOT / "conf" / "digits_mlp.conf").read_text()
    for split in ("train", "test"):
        text = text.replace(f'backend: "hdf5" path: "data/digits/{split}.h5"',
                            f'backend: "kvfile" path: "{folder}/kv/{split}.bin"')
    assert text.count('backend: "kvfile"') == 2
    conf = folder / "torn.conf"
    conf.write_text(text + "gpu: 0\n")
    return conf


@pytest.mark.parametrize("ranks", [0, 2], ids=["one process", "2 ranks"])
def test_a_torn_store_and_an_ignored_field_are_each_said_once(torn_job, tmp_path, ranks):
    prefix = mpiexec_command(ranks) if ranks else []
    result = subprocess.run(prefix + [sys.executable, "-m", "singa_mpi", "train", str(torn_job), "--steps", "2",
                                      "--workers", str(max(ranks, 1)), "--workspace", str(tmp_path / "ws")],
                            cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    # before: once per rank, and the torn record twice on each (the first batches, then training)
    assert result.stderr.count(TORN) == 1, result.stderr
    assert result.stderr.count(IGNORED_GPU) == 1, result.stderr
