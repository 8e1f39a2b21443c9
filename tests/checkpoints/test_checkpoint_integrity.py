"""Checkpoint integrity and identity: flipped bytes, an edited header, another job's checkpoint,
files of the previous format, and temporary files of killed writers."""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nets
from singa_mpi.checkpoints import hdf5 as checkpoint, snapshot
from singa_mpi.checks.job import validate
from singa_mpi.config.load import parse_job
from singa_mpi.errors import ConfigError, DataError
from checkpoint_jobs import job_file, train, write_format_2
from mpi_jobs import mpi_env, mpiexec_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LONG = os.environ.get("SINGA_MPI_FUZZ") == "long"  # the nightly size: every byte, many more examples


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workspace with good checkpoints at steps 2 and 4 of the small MLP (Adam: two updater slots)."""
    tmp = tmp_path_factory.mktemp("trained")
    data = nets.make_data(str(tmp / "data.h5"), 64, (12,), 5)
    conf = str(tmp / "job.conf")
    with open(conf, "w") as f:
        f.write(nets.mlp(data, 7, "data", steps=4, updater=nets.updater("adam")) + "checkpoint_after: 2 checkpoint_freq: 2\n")
    assert train(conf, tmp / "ws") == 0
    return conf, tmp / "ws"


def same_content(a: checkpoint.Checkpoint, b: checkpoint.Checkpoint) -> bool:
    """Every field but the path equal, arrays bit for bit."""
    def arrays_equal(x: dict, y: dict) -> bool:
        return sorted(x) == sorted(y) and all(
            arrays_equal(x[k], y[k]) if isinstance(x[k], dict) else np.array_equal(x[k], y[k]) for k in x)

    scalars = ("step", "job_name", "job_config", "plan", "seed", "nranks", "elapsed", "display_window",
               "job_identity", "format_version", "counters", "readers")
    return (all(getattr(a, k) == getattr(b, k) for k in scalars) and arrays_equal(a.params, b.params)
            and arrays_equal(a.updater, b.updater) and arrays_equal(a.carried, b.carried))


def flipped(source: str, target: str, flips: list[tuple[int, int]]) -> None:
    """``source`` copied to ``target`` with each byte at ``position`` XORed by ``mask``."""
    data = bytearray(open(source, "rb").read())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    with open(target, "wb") as f:
        f.write(data)


def resealed(path: str) -> None:
    """Seal ``path`` anew, as if its damage had happened before it was written: what the checks
    behind the whole-file seal (header, layout and dataset checksums) must then catch."""
    with open(path, "rb") as f:
        image = f.read()
    with open(path, "wb") as f:
        f.write(checkpoint.seal(image))


def verdict(path: str, good: checkpoint.Checkpoint) -> str:
    """"same" when the file reads with ``good``'s content, "damage" for a DataError naming the file."""
    try:
        got = checkpoint.read(path)
    except DataError as err:
        assert str(err).startswith(path) and "\n" not in str(err), str(err)
        # what is wrong with the file, in words: no Python exception class names (h5py's RuntimeError...)
        assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b", str(err)), str(err)
        return "damage"
    assert same_content(got, good), f"{path} read without error but with other content"
    return "same"


@pytest.mark.slow
def test_every_flipped_byte_reads_the_same_or_is_reported_and_resume_falls_back(trained, tmp_path):
    """Bytes all over a real checkpoint, flipped one at a time: every 13th of the first 2 KiB (HDF5's
    superblock, object headers, heaps), every 97th beyond (SINGA_MPI_FUZZ=long: every byte for the
    seal).  The seal reports each flip before HDF5 reads anything.  Behind the seal (the flipped file
    sealed anew: damage done before the write) the sampled flips read the same or as a DataError, no
    other exception type (it used to raise TypeError, RuntimeError, AttributeError), and `--resume`
    falls back to step 2.  Only the samples: a few other flips of HDF5's metadata crash libhdf5
    (a segmentation fault, or memory it corrupts), which is why the seal comes first."""
    _, ws = trained
    newest = checkpoint.checkpoint_path(str(ws), 4)
    good, older = checkpoint.read(newest), checkpoint.read(checkpoint.checkpoint_path(str(ws), 2))
    size = os.path.getsize(newest)
    sampled = set(range(0, min(size, 2048), 13)) | set(range(0, size, 97))
    positions = range(size) if LONG else sorted(sampled)
    work = tmp_path / "ws"
    os.makedirs(checkpoint.checkpoint_dir(str(work)))
    shutil.copy(checkpoint.checkpoint_path(str(ws), 2), checkpoint.checkpoint_path(str(work), 2))
    target = checkpoint.checkpoint_path(str(work), 4)
    seen = {"same": 0, "damage": 0}
    with open(newest, "rb") as f:
        padding = f.read(checkpoint.USER_BLOCK).index(b"\0")  # where the seal's text ends
    for position in positions:
        flipped(newest, target, [(position, 0xFF)])
        # the seal: every flip is damage, but for the zero padding of the user block
        assert verdict(target, good) == ("same" if checkpoint.USER_BLOCK > position >= padding else "damage"), position
        if position not in sampled:
            continue
        resealed(target)  # behind the seal: HDF5's own structures and the checksums inside
        outcome = verdict(target, good)
        seen[outcome] += 1
        if outcome == "damage" and seen["damage"] % 4 == 1:  # a sample: each costs two more reads
            with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step4\.h5"):
                assert same_content(checkpoint.newest_good(str(work)), older), position
    assert seen["damage"] > 50 and seen["same"] > 50, seen  # both outcomes exercised


def test_random_multi_byte_damage_never_escapes_as_another_exception(trained, tmp_path):
    """Property: any few flipped bits anywhere read as the same content or as a DataError."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    _, ws = trained
    source = checkpoint.checkpoint_path(str(ws), 4)
    good = checkpoint.read(source)
    target = str(tmp_path / "step4.h5")

    @hypothesis.settings(max_examples=2000 if LONG else 60, deadline=None,
                         derandomize=not LONG, database=None)
    @hypothesis.given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=4))
    def damaged_reads(flips):
        flipped(source, target, flips)
        verdict(target, good)

    damaged_reads()


def test_an_edited_step_is_damage_and_resume_skips_the_file(trained, tmp_path):
    conf, ws = trained
    work = tmp_path / "ws"
    shutil.copytree(ws, work)
    newest = checkpoint.checkpoint_path(str(work), 4)
    with h5py.File(newest, "r+") as f:
        f.attrs["step"] = 3  # what the campaign did: resume then started at the edited step
    with pytest.raises(DataError, match=r"step4\.h5: fails its whole-file checksum"):
        checkpoint.read(newest)
    resealed(newest)
    with pytest.raises(DataError, match=r"step4\.h5: its header or layout fails its checksum"):
        checkpoint.read(newest)
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step4\.h5"):
        assert checkpoint.newest_good(str(work)).step == 2


def test_resume_with_every_checkpoint_damaged_stops_in_one_line_instead_of_starting_over(trained, tmp_path):
    """Both checkpoints damaged: `--resume` stops (exit 3, one line on 2 ranks), where it used to note
    "no checkpoint" and train again from step 0, which a long run's user would not notice."""
    conf, ws = trained
    work = tmp_path / "ws"
    shutil.copytree(ws, work)
    for step in (2, 4):
        path = checkpoint.checkpoint_path(str(work), step)
        flipped(path, path, [(os.path.getsize(path) // 2, 0xFF)])
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"), pytest.raises(
            DataError, match=r"checkpoint: every checkpoint there is damaged \(2 file\(s\), the newest step4\.h5\)"):
        checkpoint.newest_good(str(work))
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(work),
                                "--resume", "--steps", "6"]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "every checkpoint there is damaged" in line]
    assert len(lines) == 1 and "move them aside" in lines[0], result.stderr[-2000:]
    assert sorted(os.listdir(work / "checkpoint")) == ["step2.h5", "step4.h5"]  # no fresh start wrote step0


@pytest.mark.parametrize("damage", ["rename a param", "edit the data position", "edit job_config", "edit plan"])
def test_every_part_of_the_file_is_covered_by_a_checksum(trained, tmp_path, damage):
    """The README's promise: every dataset carries its checksum (/job_config and /plan had none), and the
    layout and attributes are covered by the header's."""
    _, ws = trained
    path = str(tmp_path / "step4.h5")
    shutil.copy(checkpoint.checkpoint_path(str(ws), 4), path)
    with h5py.File(path, "r+") as f:
        assert "crc32" in f["job_config"].attrs and "crc32" in f["plan"].attrs
        if damage == "rename a param":
            f.move("params/w_fc1", "params/w_fc9")
        elif damage == "edit the data position":
            f["readers/train/data"].attrs["batches"] = 3  # where the input layer goes on reading
        else:  # same layout and attributes, other text
            name = "job_config" if damage == "edit job_config" else "plan"
            old = f[name]
            text, crc = old[()].decode(), int(old.attrs["crc32"])
            del f[name]
            f.create_dataset(name, data=text.replace("1", "2").replace("seed", "sead"))
            f[name].attrs["crc32"] = crc
    expected = {"rename a param": "header or layout fails", "edit the data position": "header or layout fails",
                "edit job_config": "job_config fails its checksum", "edit plan": "plan fails its checksum"}
    with pytest.raises(DataError, match="fails its whole-file checksum"):
        checkpoint.read(path)
    resealed(path)  # each part's own checksum, behind the seal
    with pytest.raises(DataError, match=expected[damage]):
        checkpoint.read(path)


# ------------------------------------------------------------------ identity

def identity_of(cfg) -> str:
    """The job identity a run of ``cfg`` writes: from the param shapes checking the job finds."""
    return snapshot.job_identity(cfg, dict(validate(cfg).params))


def test_identity_ignores_the_run_and_the_partitioning_but_not_the_net(tmp_path):
    data = str(tmp_path / "d.h5")

    def identity(text: str) -> str:
        return identity_of(parse_job(text, "x.conf"))

    base = nets.mlp(data, 7, "data")
    same = [nets.mlp(data, 7, scheme) for scheme in ("feature", "hybrid", "pipeline")]
    same += [base.replace("train_steps: 20", "train_steps: 99").replace("seed: 5", "seed: 6"),
             base.replace("base_lr: 0.05", "base_lr: 0.5").replace("batchsize: 7", "batchsize: 9"),
             nets.mlp(data, 7, "data", updater=nets.updater("adam"))]
    assert {identity(text) for text in same} == {identity(base)}
    other = [base.replace("kSTanh", "kSigmoid"), base.replace("num_output: 16", "num_output: 17"),
             base.replace('name: "w_fc2"', 'name: "w_second"')]
    assert len({identity(text) for text in other} | {identity(base)}) == 4


def test_the_identity_of_an_example_job_is_what_earlier_versions_wrote():
    """A checkpoint written before keeps resuming: the identity of conf/digits_mlp.conf as its
    checkpoints carry it (to change only with that job's net)."""
    conf = os.path.join(os.path.dirname(__file__), "..", "..", "conf", "digits_mlp.conf")
    assert identity_of(parse_job(open(conf).read(), conf)) == "e5359a1b25e2e789"


def test_resuming_another_jobs_checkpoint_is_refused_unless_asked(tmp_path):
    conf = job_file(tmp_path, steps=2)
    assert train(conf, tmp_path / "ws") == 0
    other = tmp_path / "other.conf"
    other.write_text(open(conf).read().replace("kSTanh", "kSigmoid"))  # the same param shapes
    mine = identity_of(parse_job(open(conf).read(), conf))
    theirs = identity_of(parse_job(other.read_text(), str(other)))
    with pytest.raises(ConfigError) as err:
        train(str(other), tmp_path / "ws", resume=True, steps=4)
    message = str(err.value)
    assert "step2.h5: written by another job" in message and mine in message and theirs in message
    assert "--allow-other-job" in message and "\n" not in message
    assert [step for step, _ in checkpoint.listed(str(tmp_path / "ws"))] == [2]  # nothing written
    assert train(str(other), tmp_path / "ws", resume=True, steps=4, allow_other_job=True) == 0
    assert checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "ws"), 4)).job_identity == theirs


def test_a_refused_resume_still_removes_a_dead_writers_temporary_file(tmp_path):
    """The identity check moved before the workspace's claim (every rank, before the vote), and a
    refused --resume then left a killed writer's stepN.h5.tmp<PID> behind (the fuzz test of resuming
    caught it): the root clears them before the checkpoint is judged."""
    conf = job_file(tmp_path, steps=2)
    assert train(conf, tmp_path / "ws") == 0
    stale = tmp_path / "ws" / "checkpoint" / f"step9.h5.tmp{2**22 + 17}"  # no such PID
    assert stale.parent == pathlib.Path(checkpoint.checkpoint_dir(str(tmp_path / "ws")))
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / "other.conf"
    other.write_text(open(conf).read().replace("kSTanh", "kSigmoid"))
    with pytest.raises(ConfigError, match="written by another job"):
        train(str(other), tmp_path / "ws", resume=True, steps=4)
    assert not stale.exists()


def test_another_jobs_checkpoint_under_mpi_is_one_line_exit_2(tmp_path):
    conf = job_file(tmp_path, steps=2)
    assert train(conf, tmp_path / "ws") == 0
    other = tmp_path / "other.conf"
    other.write_text(open(conf).read().replace("kSTanh", "kSigmoid"))
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(other), "--workspace",
                                str(tmp_path / "ws"), "--resume", "--steps", "4"]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "written by another job" in line]
    assert len(lines) == 1 and "--allow-other-job" in lines[0], result.stderr[-2000:]


@pytest.mark.parametrize("cluster,n", [("nworkers_per_group: 2 nserver_groups: 1 nservers_per_group: 1 "
                                       "server_worker_separate: true", 3),
                                       ("nworker_groups: 2 nserver_groups: 2 share_memory: false", 2)],
                         ids=["sandblaster", "hogwild"])
def test_another_nets_checkpoint_under_a_framework_is_the_one_identity_line_exit_2(tmp_path, cluster, n):
    """Another net (other param shapes): every rank checks the identity before the vote.  The root
    alone checked it after, so a worker that loaded the params first ended the job with its own
    line (rank 1: a param's shape, exit 3)."""
    conf = job_file(tmp_path, steps=2, extra=f"cluster {{ {cluster} }}\n")
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "ws")]
    first = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    other = tmp_path / "other.conf"
    other.write_text(open(conf).read().replace("num_output: 16", "num_output: 20"))
    cmd[cmd.index(conf)] = str(other)
    result = subprocess.run(cmd + ["--resume", "--steps", "4"], cwd=ROOT, env=mpi_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "has shape" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "written by another job" in line]
    assert len(lines) == 1 and "--allow-other-job" in lines[0], result.stderr[-2000:]


def test_format_2_checkpoints_are_read_and_resumed_with_a_note(trained, tmp_path, capsys):
    conf, ws = trained
    good = checkpoint.read(checkpoint.checkpoint_path(str(ws), 2))
    work = tmp_path / "ws"
    os.makedirs(checkpoint.checkpoint_dir(str(work)))
    old = checkpoint.checkpoint_path(str(work), 2)
    write_format_2(old, good)
    read = checkpoint.read(old)
    assert read.format_version == 2 and read.job_identity == "" and read.step == 2
    for name in good.params:
        np.testing.assert_array_equal(read.params[name], good.params[name])
    assert train(conf, work, resume=True) == 0
    assert "has no job identity (format 2" in capsys.readouterr().out
    np.testing.assert_array_equal(checkpoint.read(checkpoint.checkpoint_path(str(work), 4)).params["w_fc1"],
                                  checkpoint.read(checkpoint.checkpoint_path(str(ws), 4)).params["w_fc1"])


# ------------------------------------------------------------------ temporary files of killed writers

def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_writer_killed_mid_write_leaves_a_tmp_file_the_next_start_removes(trained, tmp_path, capsys):
    conf, ws = trained
    work = tmp_path / "ws"
    shutil.copytree(ws, work)
    killed = f"""
import os, signal
from singa_mpi.checkpoints import hdf5 as checkpoint
ckpt = checkpoint.read({checkpoint.checkpoint_path(str(work), 4)!r})
ckpt.step = 6
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed after writing, before the rename
checkpoint.write({checkpoint.checkpoint_path(str(work), 6)!r}, ckpt)
"""
    result = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL
    folder = checkpoint.checkpoint_dir(str(work))
    left = [name for name in os.listdir(folder) if ".tmp" in name]
    assert len(left) == 1 and left[0].startswith("step6.h5.tmp"), os.listdir(folder)
    live = os.path.join(folder, f"step8.h5.tmp{os.getppid()}")  # a live writer's, just written: kept
    open(live, "wb").close()
    reused = os.path.join(folder, f"step9.h5.tmp{os.getppid()}")  # a live PID, but idle for an hour: gone
    open(reused, "wb").close()
    os.utime(reused, (os.path.getmtime(reused) - 3600,) * 2)
    also_dead = os.path.join(folder, f"step7.h5.tmp{dead_pid()}")
    open(also_dead, "wb").close()
    assert train(conf, work, resume=True, steps=5) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "temporary file(s) of an interrupted checkpoint write" in line]
    assert len(notes) == 1 and "removed 3 " in notes[0] and left[0] in notes[0], out
    assert sorted(name for name in os.listdir(folder) if ".tmp" in name) == [os.path.basename(live)]
    assert [step for step, _ in checkpoint.listed(str(work))] == [5, 4, 2]


@pytest.mark.parametrize("content, expected", [
    (b"name: 'mlp'\ntrain_steps: 4\n", "a text file (a job file?), not a checkpoint: expected a checkpoint such as "
                                       "WORKSPACE/checkpoint/step<N>.h5"),
    (b"#" * 4095 + "\u2603 snowmen\n".encode(), "a text file (a job file?), not a checkpoint"),  # cut at the probe
    (b"\x1f\x8b\x08\x00", "a gzip file, not a checkpoint: expected a checkpoint such as"),
    (b"", "an empty file: expected a checkpoint such as WORKSPACE/checkpoint/step<N>.h5"),
    (b"\x00\x01\x02garbage", "not a singa_mpi checkpoint, or its first bytes are damaged"),
])
def test_a_file_that_is_no_checkpoint_says_what_it_holds(tmp_path, content, expected):
    """A job file given where a command takes a checkpoint (`draw filters JOB`) was called damaged."""
    path = tmp_path / "given"
    path.write_bytes(content)
    with pytest.raises(DataError) as err:
        checkpoint.read(str(path))
    assert str(err.value).startswith(f"{path}: {expected}"), err.value


@pytest.mark.parametrize("command", ["train --allow-other-job", "test"])
def test_another_nets_checkpoint_taken_anyway_is_one_voted_line_from_rank_0_exit_3(tmp_path, command):
    """Another net's checkpoint (other param shapes) resumed with --allow-other-job, or given to `test`:
    the line came from the first rank that failed to load it (`singa-mpi: rank 1: error at step 0`),
    by abort.  Every rank now checks the params' shapes before the vote: one line, from rank 0, exit 3."""
    conf = job_file(tmp_path, steps=2, extra="test_steps: 1 test_freq: 2\n")
    assert train(conf, tmp_path / "ws") == 0
    other = tmp_path / "other.conf"
    other.write_text(open(conf).read().replace("num_output: 16", "num_output: 20"))
    words = command.split()
    extra = ["--resume", "--steps", "4", *words[1:]] if words[0] == "train" else []
    cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", words[0], str(other), "--workspace",
                                str(tmp_path / "ws"), *extra]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "error at step" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "has shape" in line]
    assert len(lines) == 1 and lines[0].startswith("singa-mpi: error: "), result.stderr[-2000:]
    assert "(on rank" not in lines[0] and "the net expects" in lines[0], lines  # every rank found it
    assert [step for step, _ in checkpoint.listed(str(tmp_path / "ws"))] == [2]  # nothing written
