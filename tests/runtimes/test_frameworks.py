"""SINGA's frameworks under mpiexec: Downpour, bounded staleness and Hogwild converge, a slow group
holds nobody back, a dead server is named, checkpoints move between frameworks, bad clusters are
refused.

Asynchronous training cannot equal the serial run, so its test is convergence: on the digits job,
Downpour (2 groups of 1 worker, 1 server), stale synchronous parallel, in-memory and distributed
Hogwild, with 1.2x the serial run's samples, reach the serial run's final test accuracy (less one
test image of 359) at one of group 0's tests.  Sandblaster's equality
with the serial run is tests/mpi/test_servers.py.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from mpi_jobs import finish, launcher_word, mpi_env, mpiexec_command, rank_pids, wait_for_progress

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = open(os.path.join(ROOT, "conf", "digits_mlp.conf")).read()
SERIAL_STEPS = 300


def digits_job(tmp_path, name: str, cluster: str, steps: int, extra: str = "", layers: str = "",
               test_freq: int | None = None) -> str:
    """conf/digits_mlp.conf with ``cluster`` and ``steps`` (test at the end, or every ``test_freq``),
    data prepared beside it."""
    text = re.sub(r"(?m)^cluster \{.*\}$", f"cluster {{ {cluster} }}", DIGITS)
    text = re.sub(r"train_steps: \d+", f"train_steps: {steps}", text)
    text = re.sub(r"test_freq: \d+", f"test_freq: {test_freq or steps}", text)
    text = re.sub(r"disp_freq: \d+", "disp_freq: 10", text)
    text = text.replace('path: "data/digits/', f'path: "{tmp_path}/data/digits/')
    if layers:  # between the input and fc1
        text = text.replace('srclayers: "data"\n    innerproduct_conf { num_output: 256 }',
                            'srclayers: "slow"\n    innerproduct_conf { num_output: 256 }')
        text = text.replace("neuralnet {", "neuralnet {\n" + layers, 1)
    path = tmp_path / f"{name}.conf"
    path.write_text(extra + text)
    return str(path)


def run(n, conf, tmp_path, *args, limit=240, env=None):
    cmd = ([sys.executable] if n == 0 else mpiexec_command(n) + [sys.executable]) + \
        ["-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "ws"), *args]
    result = subprocess.run(cmd, cwd=ROOT, env=env or mpi_env(), capture_output=True, text=True, timeout=limit)
    return result.returncode, result.stdout, result.stderr


def entries(tmp_path, phase):
    lines = (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["phase"] == phase]


DOWNPOUR = "nworker_groups: 2 nworkers_per_group: 1 nserver_groups: 1 nservers_per_group: 1 server_worker_separate: true"
SANDBLASTER = "nworkers_per_group: 2 nserver_groups: 1 nservers_per_group: 1 server_worker_separate: true"


@pytest.fixture(scope="module")
def serial_accuracy(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("serial")
    conf = digits_job(tmp_path, "serial", "", SERIAL_STEPS)
    code, out, err = run(0, conf, tmp_path)
    assert code == 0, err
    return entries(tmp_path, "test")[-1]["accuracy"]


HOGWILD = "nworker_groups: 2 nserver_groups: 2"


@pytest.mark.parametrize("cluster,n", [(DOWNPOUR, 3), (DOWNPOUR + " max_staleness: 1", 3), (HOGWILD, 2),
                                       (HOGWILD + " share_memory: false", 2),
                                       (HOGWILD + " share_memory: false nworkers_per_group: 2", 4)],
                         ids=["downpour", "ssp1", "hogwild-in-memory", "hogwild", "hogwild-2-workers"])
@pytest.mark.slow
def test_asynchronous_groups_reach_the_serial_accuracy_with_as_many_samples(tmp_path, serial_accuracy, cluster, n):
    steps = int(1.2 * SERIAL_STEPS / 2)  # per group: 1.2x the serial run's samples in all
    code, out, err = run(n, digits_job(tmp_path, "async", cluster, steps, test_freq=15), tmp_path)
    assert code == 0, err[-3000:]
    tests = entries(tmp_path, "test")  # group 0's, every 15 of its steps (about 30 of the serial run's)
    best = max(e["accuracy"] for e in tests)
    assert best >= serial_accuracy - 1 / 359, ([round(e["accuracy"], 4) for e in tests], serial_accuracy)
    trains = entries(tmp_path, "train")
    if "server_worker_separate" not in cluster:
        return  # Hogwild: no servers, no staleness to report
    assert all("staleness" in e and "slowest_group" in e for e in trains)
    if "max_staleness: 1" in cluster:
        assert max(e["fastest_group"] - e["slowest_group"] for e in trains) <= 2  # per range, one step in flight
    assert re.search(r"staleness \d\.\d{4}  staleness_max \d+  slowest_group \d+  fastest_group \d+", out)


SLOW = textwrap.dedent('''\
    """Test plugin: a pass-through layer that sleeps in forward on the world ranks listed in SLOW_RANKS."""
    import os
    import time

    from singa_mpi.layers import LAYERS, Layer


    @LAYERS.register("kSlowOnSomeRanks")
    class Slow(Layer):
        def setup(self, src_shapes):
            rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
            self.pause = float(os.environ.get("SLOW_SECONDS", "0")) if rank in os.environ.get("SLOW_RANKS", "").split(",") else 0
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            if train and self.pause:
                time.sleep(self.pause)
            return inputs[0]

        def backward(self, grad, need):
            return [grad if need[0] else None]
    ''')


@pytest.mark.parametrize("staleness", [None, 2])
@pytest.mark.slow
def test_a_slow_group_does_not_hold_the_other_back_unless_staleness_is_bounded(tmp_path, staleness):
    (tmp_path / "slow.py").write_text(SLOW)
    cluster = DOWNPOUR + (f" max_staleness: {staleness}" if staleness is not None else "")
    layer = '  layer { name: "slow" type: kUserLayer user_type: "kSlowOnSomeRanks" srclayers: "data" }\n'
    conf = digits_job(tmp_path, "slow", cluster, 40, extra=f'plugin: "{tmp_path}/slow.py"\n', layers=layer)
    began = time.monotonic()
    code, out, err = run(3, conf, tmp_path, env=mpi_env(SLOW_RANKS="1", SLOW_SECONDS="0.1"))
    wall = time.monotonic() - began
    assert code == 0, err[-3000:]
    group0_done = entries(tmp_path, "train")[-1]["elapsed"]  # group 0's step 30 (disp_freq 10)
    assert wall > 40 * 0.1  # group 1 did sleep through its 40 steps
    if staleness is None:
        assert group0_done < 0.4 * 30 * 0.1, (group0_done, wall)  # group 0 ran ahead at its own pace
    else:
        assert group0_done > (30 - staleness - 1) * 0.1, (group0_done, wall)  # held within 2 updates


@pytest.mark.parametrize("cluster,victim,role", [(SANDBLASTER, 2, "server 0 of server group 0"),
                                                 (DOWNPOUR, 1, "worker 0 of worker group 1")],
                         ids=["sandblaster-server", "downpour-worker"])
@pytest.mark.slow
def test_a_killed_server_or_worker_rank_ends_the_job_and_is_named_with_its_role(tmp_path, cluster, victim, role):
    conf = digits_job(tmp_path, "kill", cluster, 100000)
    cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "ws")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_progress(proc, tmp_path)
    pid = rank_pids(conf)[victim]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    code, _, err = finish(proc, 30)
    assert code != 0 and time.monotonic() - killed < 30
    named = [line for line in err.splitlines() if line.startswith("singa-mpi: ") and "vanished" in line]
    assert len(named) == 1, err[-3000:]
    assert f"rank {victim} (pid {pid}" in named[0] and role in named[0], named[0]


@pytest.mark.parametrize("cluster,victim", [(SANDBLASTER, 2), (DOWNPOUR, 1)], ids=["server", "worker-group-1"])
@pytest.mark.slow
def test_a_stop_signal_that_reaches_a_server_alone_stops_every_group_with_a_checkpoint(tmp_path, cluster, victim):
    """A server rank caught the signal and did nothing with it: the job trained on to its end.  It now
    tells every group, as a group that stops does, and the job stops after one step (exit 75).  The
    signal of a server or of another group's worker is named and acknowledged by rank 0."""
    conf = digits_job(tmp_path, "signal", cluster, 100000, extra="checkpoint_freq: 100000\n")
    cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "ws")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_progress(proc, tmp_path)
    os.kill(rank_pids(conf)[victim], signal.SIGTERM)  # the server, or group 1's worker
    code, out, err = finish(proc, 60)
    assert code == checkpoint.EXIT_CHECKPOINTED, err[-3000:]
    (step, path), _ = checkpoint.listed(str(tmp_path / "ws"))  # the stop's, and step 0's
    assert 0 < step < 100000 and checkpoint.read(path).step == step
    # named, and acknowledged by rank 0 as a signal of its own is (they once said neither)
    assert f"stopped on a signal (SIGTERM) after {step} steps" in (tmp_path / "ws" / "stopped.txt").read_text()
    said = [line for line in err.splitlines() if line.startswith("singa-mpi: SIGTERM")]
    assert said == [f"singa-mpi: SIGTERM (it reached another rank): stopping after this step and writing a checkpoint; "
                    f"what was saved: {tmp_path / 'ws' / 'stopped.txt'}"], err[-3000:]


@pytest.mark.slow
def test_a_stop_signal_after_group_0_finished_ends_the_complete_run_with_exit_0_on_every_rank(tmp_path):
    """Group 0 had trained its last step when group 1 received SIGTERM: group 0's ranks exited 0 with the
    final checkpoint, group 1's 75, so the job's exit status was whichever the launcher picked.  Every
    rank now returns 0 (the run is complete) and rank 0 says the late signal stopped only group 1."""
    (tmp_path / "slow.py").write_text(SLOW)
    layer = '  layer { name: "slow" type: kUserLayer user_type: "kSlowOnSomeRanks" srclayers: "data" }\n'
    conf = digits_job(tmp_path, "late", DOWNPOUR, 20, extra=f'plugin: "{tmp_path}/slow.py"\n', layers=layer)
    with open(conf) as f:
        text = f.read().replace("disp_freq: 10", "disp_freq: 1")  # group 0's every step is in metrics.jsonl
    with open(conf, "w") as f:
        f.write(text)
    cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "ws")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(SLOW_RANKS="1", SLOW_SECONDS="1.0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(e["step"] == 19 for e in (entries(tmp_path, "train") if (tmp_path / "ws" / "metrics.jsonl").exists()
                                            else [])):
        assert proc.poll() is None and time.monotonic() < deadline, "group 0 did not reach its last step"
        time.sleep(0.2)
    os.kill(rank_pids(conf)[1], signal.SIGTERM)  # group 1's worker, still at its early steps
    code, out, err = finish(proc, 120)
    assert code == 0, err[-3000:]
    assert [step for step, _ in checkpoint.listed(str(tmp_path / "ws"))][0] == 20
    said = [line for line in out.splitlines() if "reached the job after worker group 0" in line]
    assert len(said) == 1 and "SIGTERM" in said[0] and "group(s) 1 stopped early" in said[0], out[-3000:]


NAN = textwrap.dedent('''\
    """Test plugin: a pass-through layer whose output turns NaN after 5 training steps on world rank NAN_RANK."""
    import os

    import numpy as np

    from singa_mpi.layers import LAYERS, Layer


    @LAYERS.register("kNaNOnOneRank")
    class NaN(Layer):
        def setup(self, src_shapes):
            rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
            self.poisons, self.calls = rank == os.environ.get("NAN_RANK"), 0
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            self.calls += int(train)
            return inputs[0] * np.float32("nan") if train and self.poisons and self.calls > 5 else inputs[0]

        def backward(self, grad, need):
            return [grad if need[0] else None]
    ''')


@pytest.mark.slow
def test_a_non_finite_value_in_one_hogwild_group_stops_every_group_without_a_checkpoint(tmp_path):
    """Distributed Hogwild: group 1 found a NaN and stopped without a checkpoint (exit 5), but group 0
    only saw a stop in the vote, took group 1's NaN change in the last exchange and wrote it as a
    checkpoint "stopped on a signal" (exit 75) that --resume would take as its newest good one."""
    (tmp_path / "nan.py").write_text(NAN)
    layer = '  layer { name: "slow" type: kUserLayer user_type: "kNaNOnOneRank" srclayers: "data" }\n'
    conf = digits_job(tmp_path, "nan", HOGWILD + " share_memory: false", 1000,
                      extra=f'plugin: "{tmp_path}/nan.py"\ncheckpoint_freq: 100000\n', layers=layer)
    code, out, err = run(2, conf, tmp_path, env=mpi_env(NAN_RANK="1"))
    assert code == 5, err[-3000:]
    assert [step for step, _ in checkpoint.listed(str(tmp_path / "ws"))] in ([], [0]), err[-3000:]
    assert not (tmp_path / "ws" / "stopped.txt").exists() and "stopped on a signal" not in out
    lines = [line for line in err.splitlines() if line.startswith("singa-mpi: error")]
    assert len(lines) == 1 and "worker group 1" in lines[0], err[-3000:]


@pytest.mark.slow
def test_a_downpour_checkpoint_resumes_under_other_frameworks_and_back(tmp_path):
    down = digits_job(tmp_path, "down", DOWNPOUR + ' workspace: "x"', 20, extra="checkpoint_freq: 10\n")
    code, out, err = run(3, down, tmp_path)
    assert code == 0, err[-3000:]
    written = checkpoint.read(str(tmp_path / "ws" / "checkpoint" / "step20.h5"))
    assert sorted(written.params) == ["b1", "b2", "b3", "w1", "w2", "w3"]
    assert sorted(written.updater) == sorted(written.params)  # momentum history, from the server
    assert all(slots["history"].any() for slots in written.updater.values())
    for n, cluster, steps in [(3, SANDBLASTER, 30), (2, "", 40), (0, "", 50), (3, DOWNPOUR, 60),
                              (2, HOGWILD + " share_memory: false", 70), (2, HOGWILD, 80), (0, "", 90)]:
        conf = digits_job(tmp_path, f"resume{steps}", cluster, steps, extra="checkpoint_freq: 10\n")
        code, out, err = run(n, conf, tmp_path, "--resume")
        assert code == 0, (cluster, err[-3000:])
        assert f"resuming from {tmp_path}/ws/checkpoint/step{steps - 10}.h5 (step {steps - 10})" in out, out
        assert entries(tmp_path, "train")[-1]["step"] >= steps - 10
        assert entries(tmp_path, "test")[-1]["accuracy"] > 0.5


@pytest.mark.parametrize("cluster,n,expected", [
    (DOWNPOUR, 2, "2 worker group(s) x 1 worker(s) + 1 server group(s) x 1 server(s) need 3 ranks, launched with 2: "
                  "expected {launcher} -n 3"),
    (SANDBLASTER.replace("nservers_per_group: 1", "nservers_per_group: 0"), 3,
     "cluster.nservers_per_group = 0: expected at least 1"),
    ("nworker_groups: 3 nserver_groups: 2", 3, "nworker_groups: 3 cannot be divided among nserver_groups: 2"),
])
def test_a_cluster_that_cannot_run_is_one_line_before_any_communication(tmp_path, cluster, n, expected):
    code, out, err = run(n, digits_job(tmp_path, "bad", cluster, 10), tmp_path)
    lines = [line for line in err.splitlines() if line.startswith("singa-mpi: error")]
    # the launcher named is the one that started the ranks (MPICH's is mpiexec: it has no mpirun)
    assert code == 2 and len(lines) == 1 and expected.format(launcher=launcher_word()) in lines[0], err[-3000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("name,n,roles", [
    ("sandblaster", 5, "server group 0: ranks 3..4"), ("allreduce", 3, None),
    ("downpour", 6, "worker group 1: ranks 2..3"), ("hogwild", 3, "worker group 2: ranks 2")])
@pytest.mark.slow
def test_singas_four_framework_examples_run_with_the_ranks_they_imply(tmp_path, name, n, roles):
    conf = os.path.join(ROOT, "conf", f"digits_{name}.conf")
    plan = subprocess.run([sys.executable, "-m", "singa_mpi", "plan", conf], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    if roles:
        assert roles in plan.stdout and f"launch with mpiexec -n {n}" in plan.stdout, plan.stdout
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--steps", "20",
                                "--workspace", str(tmp_path / "ws")]
    result = subprocess.run(cmd, cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert entries(tmp_path, "test")[-1]["accuracy"] > 0.5


@pytest.mark.slow
def test_a_non_finite_gradient_of_one_group_ends_every_group_in_one_line_without_a_checkpoint(tmp_path):
    """The server refuses the sum and tells every group; the group that found it says where."""
    conf = digits_job(tmp_path, "nan", DOWNPOUR, 100, extra="checkpoint_freq: 50\n")
    text = open(conf).read().replace("base_lr: 0.05", "base_lr: 1e8")
    open(conf, "w").write(text)
    code, out, err = run(3, conf, tmp_path)
    lines = [line for line in err.splitlines() if line.startswith("singa-mpi: ")]
    # the group that found it says so; group 0 may also find it first in its test on the servers' values
    assert code == 5 and 1 <= len(lines) <= 2, err[-3000:]
    assert all("non-finite value at step" in line for line in lines), err[-3000:]
    assert "Traceback" not in err
    assert os.listdir(tmp_path / "ws" / "checkpoint") == ["step0.h5"]  # the initial values, nothing after


@pytest.mark.slow
def test_waits_of_asynchronous_groups_are_no_stall_but_a_stopped_server_is(tmp_path):
    """--stall-timeout: a group done long before the other, and servers between messages, wait as they
    should; a server stopped with SIGSTOP holds its workers' replies and is named."""
    (tmp_path / "slow.py").write_text(SLOW)
    layer = '  layer { name: "slow" type: kUserLayer user_type: "kSlowOnSomeRanks" srclayers: "data" }\n'
    conf = digits_job(tmp_path, "patient", DOWNPOUR, 12, extra=f'plugin: "{tmp_path}/slow.py"\n', layers=layer)
    code, out, err = run(3, conf, tmp_path, "--stall-timeout", "1.5", env=mpi_env(SLOW_RANKS="1", SLOW_SECONDS="0.4"))
    assert code == 0 and "stalled" not in err, err[-3000:]

    second = tmp_path / "second"
    second.mkdir()
    conf = digits_job(second, "stopped", SANDBLASTER, 100000)
    cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(second / "ws"),
                                "--stall-timeout", "3"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_progress(proc, second)
    pid = rank_pids(conf)[2]
    os.kill(pid, signal.SIGSTOP)
    try:
        code, _, err = finish(proc, 60)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    stalled = [line for line in err.splitlines() if "stalled" in line]
    assert code != 0 and stalled, err[-3000:]
    assert f"rank 2 (pid {pid}" in stalled[0] and "stopped" in stalled[0], stalled[0]


@pytest.mark.slow
def test_singa_mpi_test_runs_a_framework_job_as_one_group_on_any_rank_count(tmp_path):
    code, _, err = run(3, digits_job(tmp_path, "trained", DOWNPOUR, 20), tmp_path)
    assert code == 0, err[-3000:]
    conf = str(tmp_path / "trained.conf")
    for n in (0, 2):
        cmd = ([sys.executable] if n == 0 else mpiexec_command(n) + [sys.executable]) + \
            ["-m", "singa_mpi", "test", conf, "--workspace", str(tmp_path / "ws")]
        result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "testing " in result.stdout and "step20.h5 (step 20)" in result.stdout, \
            result.stdout[-2000:] + result.stderr[-2000:]
