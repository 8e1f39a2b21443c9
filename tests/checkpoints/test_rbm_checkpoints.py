"""RBM jobs checkpoint and resume like any other, and checkpoint_path reads what SINGA's chains name."""
import numpy as np
import pytest

import nets
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checkpoints.tools import read_initial
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2
from checkpoint_jobs import final, mpi_train, train


def rbm_job(tmp_path, scheme="data", steps=16, name="rbm", cd_k=2, nranks=2):
    data = tmp_path / "unit.h5"
    if not data.exists():
        nets.make_data(str(data), 64, (12,), 5, unit=True)
    path = tmp_path / f"{name}.conf"
    path.write_text(nets.rbm(str(data), 7, scheme, cd_k, nranks, steps=steps, test=True))
    return str(path)


def assert_bitwise(a: checkpoint.Checkpoint, b: checkpoint.Checkpoint) -> None:
    assert sorted(a.params) == sorted(b.params)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
        for slot in a.updater.get(name, {}):
            np.testing.assert_array_equal(a.updater[name][slot], b.updater[name][slot])


def test_rbm_resume_is_bitwise(tmp_path):
    conf = rbm_job(tmp_path)
    assert train(conf, tmp_path / "straight") == 0
    assert train(conf, tmp_path / "split", steps=7) == 0
    assert train(conf, tmp_path / "split", resume=True) == 0
    assert_bitwise(final(tmp_path / "straight", 16), final(tmp_path / "split", 16))


@pytest.mark.slow
def test_rbm_resume_on_the_same_ranks_is_bitwise_and_on_others_within_float_noise(tmp_path):
    """2 ranks with hidden units split, resumed on 2 ranks (bitwise), and a run moved 1 -> 3 -> 2 ranks
    across data, location and feature schemes (within 1e-5 of the serial run)."""
    feature = rbm_job(tmp_path, "feature", name="feature")
    mpi_train(2, feature, tmp_path / "straight")
    mpi_train(2, feature, tmp_path / "split", "--steps", "8")
    mpi_train(2, feature, tmp_path / "split", "--resume")
    assert_bitwise(final(tmp_path / "straight", 16), final(tmp_path / "split", 16))
    confs = {"data": rbm_job(tmp_path, "data", name="d"), "location": rbm_job(tmp_path, "location", name="l", nranks=3)}
    assert train(confs["data"], tmp_path / "serial") == 0
    ws = tmp_path / "moving"
    mpi_train(1, confs["data"], ws, "--steps", "5")
    mpi_train(3, confs["location"], ws, "--steps", "10", "--resume")
    mpi_train(2, feature, ws, "--resume")
    reference, moved = final(tmp_path / "serial", 16), final(ws, 16)
    for name, value in reference.params.items():
        scale = max(float(np.abs(value).max()), 1e-6)
        assert float(np.abs(moved.params[name] - value).max()) / scale < 1e-5, name


# ------------------------------------------------------------------ checkpoint_path entries

def saved(path, params, step=3) -> str:
    return checkpoint.write(str(path), checkpoint.Checkpoint(step=step, params=params))


def test_checkpoint_path_may_name_a_workspace_its_newest_checkpoint(tmp_path):
    ws = tmp_path / "ws"
    saved(checkpoint.checkpoint_path(str(ws), 3), {"w": np.zeros(2, np.float32)})
    saved(checkpoint.checkpoint_path(str(ws), 9), {"w": np.ones(2, np.float32)}, step=9)
    for path in (ws, ws / "checkpoint"):
        assert read_initial(str(path)).step == 9
    with pytest.raises(DataError, match=r"no good checkpoint in .*empty/checkpoint: expected the job that trains "
                                        r"into .*empty to have run"):
        (tmp_path / "empty").mkdir()
        read_initial(str(tmp_path / "empty"))


def test_singa_checkpoint_names_read_ours_or_singa_s_blobprotos(tmp_path):
    """rbm2.conf names examples/rbm/rbm1/checkpoint/step6000-worker0: running rbm1.conf here wrote
    step6000.h5 there; a real SINGA file of that name (BlobProtos, '0#'-prefixed) is read as well."""
    folder = tmp_path / "rbm1" / "checkpoint"
    ours = saved(folder / "step6000.h5", {"w1": np.full((2, 3), 7, np.float32)}, step=6000)
    assert read_initial(str(folder / "step6000-worker0")).path == ours
    with pytest.raises(DataError, match=r"step5-worker0: no such checkpoint, nor .*step5\.h5 \(this tool's name"):
        read_initial(str(folder / "step5-worker0"))
    singa = tmp_path / "singa"
    singa.mkdir()
    # W split on axis 0 over two workers; b11 of a data-parallel layer, written by its owner (worker 0) alone;
    # b12 a feature-partitioned bias whose parts are equal (zeros at step 0): parts all the same
    for worker, rows in ((0, [[1, 2]]), (1, [[3, 4]])):
        blobs = job_pb2.BlobProtos()
        for name, value in (("0#w1", rows), ("0#b11", [5, 6]), ("0#b12", [0])):
            if name == "0#b11" and worker != 0:
                continue
            blobs.name.append(name)
            blob = blobs.blob.add()
            arr = np.asarray(value, np.float32)
            blob.shape.extend(arr.shape)
            blob.data.extend(arr.reshape(-1))
        (singa / f"step6000-worker{worker}").write_bytes(blobs.SerializeToString())
    ckpt = read_initial(str(singa / "step6000-worker0"))
    assert ckpt.step == 6000
    np.testing.assert_array_equal(ckpt.params["w1"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(ckpt.params["b11"], [5, 6])
    np.testing.assert_array_equal(ckpt.params["b12"], [0, 0])
