"""BLAS threads per rank: the rule, the user's variables winning, the limit inside a run, the warning."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import nets
from blas_threads import blas_threads_now
from singa_mpi import cli, threads
from singa_mpi.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cores, ranks, env, expected", [
    (2, 1, {}, 2),  # serial: a thread per core
    (2, 2, {}, 1),  # two ranks share two cores
    (16, 4, {}, 4),
    (2, 4, {}, 1),  # more ranks than cores: still one each
    (1, 1, {}, 1),
    (2, 2, {"OMP_NUM_THREADS": "3"}, 3),  # the user's count wins, even when it oversubscribes
    (8, 1, {"OPENBLAS_NUM_THREADS": "1"}, 1),
    (8, 1, {"MKL_NUM_THREADS": "2"}, 2),
    (8, 1, {"OMP_NUM_THREADS": "4,2"}, 4),  # OpenMP's nested form: the outer level
    (2, 2, {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"}, 2),  # the BLAS's own variable wins
    (2, 2, {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"}, 1),
    (8, 2, {"OMP_NUM_THREADS": ""}, 4),  # empty or nonsense: not a setting
    (8, 2, {"OMP_NUM_THREADS": "many"}, 4),
    (8, 2, {"OMP_NUM_THREADS": "0"}, 4),
])
def test_the_rule(cores, ranks, env, expected):
    assert threads.choose_threads(cores, ranks, env) == expected
    assert threads.choose_threads(cores, ranks, env, work=threads.SMALL_WORK) == expected  # not small


@pytest.mark.parametrize("cores, ranks, env, work, expected", [
    (2, 1, {}, 3.2e6, 1),  # the default job: one thread
    (2, 1, {}, 7.7e8, 2),  # mnist_mlp
    (16, 2, {}, 1e6, 1),
    (16, 2, {}, 1e9, 8),
    (2, 1, {"OMP_NUM_THREADS": "2"}, 1e6, 2),  # the user still wins
])
def test_small_jobs_get_one_thread(cores, ranks, env, work, expected):
    assert threads.choose_threads(cores, ranks, env, work) == expected


@pytest.mark.parametrize("conf, small", [("digits_mlp.conf", True), ("mnist_mlp.conf", False),
                                         ("cifar10_convnet.conf", False)])
def test_work_per_step_of_the_examples(conf, small):
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job

    cfg = load_job(str(ROOT / "conf" / conf))
    summary = validate(cfg)
    work = threads.work_per_step(cfg, summary)
    assert (work < threads.SMALL_WORK) == small
    assert threads.work_per_step(cfg, summary, 2) == work / 2
    if conf == "digits_mlp.conf":
        assert work == 64 * (64 * 256 + 256 * 128 + 128 * 10)  # batch x weights of the inner products
    if conf == "cifar10_convnet.conf":  # convolutions count every output position
        assert work > 100 * 32 * 75 * 32 * 32


@pytest.mark.parametrize("env, ranks", [
    ({}, 1),
    ({"MPI_LOCALNRANKS": "3"}, 3),  # MPICH / Intel MPI (hydra)
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),  # Open MPI
    ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 4),  # Slurm's compressed form
])
def test_ranks_on_this_node_come_from_the_launcher(env, ranks):
    assert threads.local_ranks(env) == ranks


def test_oversubscription_message():
    assert threads.oversubscription(2, 2, 1) is None
    assert threads.oversubscription(4, 1, 4) is None
    assert threads.oversubscription(2, 2, 2) == (
        "2 rank(s) x 2 BLAS thread(s) on 2 core(s) oversubscribe this node and slow every step: "
        "set OMP_NUM_THREADS=1")
    assert threads.oversubscription(2, 4, 1) == (
        "4 rank(s) x 1 BLAS thread(s) on 2 core(s) oversubscribe this node and slow every step: "
        "launch at most 2 rank(s) on this node")
    assert threads.oversubscription(2, 3, 2).endswith(": set OMP_NUM_THREADS=1 or launch at most 2 rank(s) on this node")
    # the advice names the variables that set too many, not OMP_NUM_THREADS alone (set to 1, it changed nothing)
    assert threads.oversubscription(2, 2, 2, {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"}).endswith(
        ": set OPENBLAS_NUM_THREADS=1")
    assert threads.oversubscription(4, 2, 4, {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}).endswith(
        ": set MKL_NUM_THREADS=2 and OMP_NUM_THREADS=2")


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"},
                                 {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}])
def test_the_users_count_is_the_one_numpy_s_blas_takes(env):
    """OMP_NUM_THREADS=1 with OPENBLAS_NUM_THREADS=2 was read as one thread per rank: 2 ranks x 2 threads
    on 2 cores went unwarned, and the reverse was warned of, advising the OMP_NUM_THREADS=1 already set."""
    clean = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARIABLES}
    code = "import sys; sys.path.insert(0, 'tests'); from blas_threads import blas_threads_now; print(blas_threads_now()['numpy'])"
    taken = subprocess.run([sys.executable, "-c", code], env=dict(clean, **env), cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert taken.returncode == 0, taken.stderr
    assert int(taken.stdout) == threads.user_threads(env)


def test_limit_blas_sets_numpy_and_one_for_scipy_then_restores():
    before = blas_threads_now()
    with threads.limit_blas(3) as limits:
        inside = blas_threads_now()
    assert set(limits.values()) == set(inside.values())
    assert inside["numpy"] == 3
    assert inside.get("scipy", 1) == 1
    assert blas_threads_now() == before


@pytest.mark.parametrize("small_work, expected", [(0, 3), (threads.SMALL_WORK, 1)])
def test_the_limit_is_in_effect_during_training(tmp_path, monkeypatch, small_work, expected):
    """`singa-mpi train` with no thread variables: 6 cores, 2 ranks on the node -> 3 threads in the run,
    or one for this small net."""
    monkeypatch.setattr(threads, "SMALL_WORK", small_work)
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")  # the launcher's count; the process itself is serial
    monkeypatch.setattr(threads, "cores_available", lambda: 6)
    seen = []
    original = Trainer.train_one_batch

    def recording(self, step):
        seen.append(blas_threads_now())
        return original(self, step)

    monkeypatch.setattr(Trainer, "train_one_batch", recording)
    nets.make_data(str(tmp_path / "data.h5"), 32, (12,), 5)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(str(tmp_path / "data.h5"), 8, "data", 1, steps=3))
    before = blas_threads_now()
    assert cli.main(["train", str(conf), "--workspace", str(tmp_path / "ws")]) == 0
    assert len(seen) == 3
    assert all(s["numpy"] == expected and s.get("scipy", 1) == 1 for s in seen), seen
    assert blas_threads_now() == before  # undone when the command returns


def test_the_users_variable_wins(tmp_path, monkeypatch):
    for name in threads.THREAD_VARIABLES:  # CI sets OPENBLAS_NUM_THREADS=1, which counts before OMP's
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.setattr(threads, "cores_available", lambda: 64)
    before = blas_threads_now()
    with threads.blas_threads() as count:
        assert count == 5
        assert blas_threads_now() == before  # nothing limited: the user's variable set it at load time


def test_oversubscription_warns_once_on_rank_0(capsys):
    env = {"OMP_NUM_THREADS": "2", "MPI_LOCALNRANKS": "2", "PMI_RANK": "0"}
    lines = []
    with threads.blas_threads(env=env, cores=2, warn=lines.append) as count:
        assert count == 2
    assert lines == [threads.oversubscription(2, 2, 2)]
    lines.clear()
    with threads.blas_threads(env=dict(env, PMI_RANK="1"), cores=2, warn=lines.append):
        pass
    assert lines == []  # the other ranks stay quiet
    with threads.blas_threads(env={"MPI_LOCALNRANKS": "2"}, cores=2, warn=lines.append) as count:
        assert count == 1
    assert lines == []  # the chosen count never oversubscribes


def test_the_warning_is_one_line_on_stderr_of_the_command(tmp_path):
    nets.make_data(str(tmp_path / "data.h5"), 32, (12,), 5)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(str(tmp_path / "data.h5"), 8, "data", 1, steps=2))
    too_many = threads.cores_available() + 1
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": str(too_many), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace", str(tmp_path / "ws")],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "oversubscribe" in line]
    assert warnings == [f"warning: {threads.oversubscription(too_many - 1, 1, too_many)}"], out.stderr


# ------------------------------------------------------------------ a launcher's core binding

@pytest.mark.parametrize("ranks, mine, launchers, sharing", [
    (2, 1, 2, 1),  # Open MPI's default binding: each of 2 ranks on its own core of 2
    (2, 2, 2, 2),  # --bind-to none: both ranks share the node's 2 cores
    (8, 8, 16, 4),  # bound to a socket of 8 cores, 8 ranks on 2 sockets: 4 share each
    (4, 1, 16, 1),  # bound to a core each
    (2, 2, 16, 1),  # bound to 2 cores each
    (1, 4, 4, 1),  # serial
    (3, 2, 2, 3),  # more ranks than cores, not bound: all share
])
def test_ranks_sharing_this_ranks_cores(ranks, mine, launchers, sharing):
    assert threads.sharing_ranks(ranks, mine, launchers) == sharing


def fake_affinity(monkeypatch, mine: set[int], parents: set[int]) -> None:
    """This process may run on ``mine``, its launcher (the parent) on ``parents``."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(mine if pid in (0, threads.os.getpid())
                                                                         else parents))


def test_a_rank_bound_to_its_own_core_is_not_oversubscribed(monkeypatch):
    """Open MPI binds each of 2 ranks to a core of its own (OMPI_MCA_orte_bound_at_launch=1): one core in
    the rank's affinity, two ranks on the node, one BLAS thread -- not "2 rank(s) x 1 BLAS thread(s)
    on 1 core(s)"."""
    fake_affinity(monkeypatch, {1}, {0, 1})
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_MCA_orte_bound_at_launch": "1"}
    lines = []
    with threads.blas_threads(env=env, warn=lines.append, work=threads.SMALL_WORK / 2) as count:
        assert count == 1
    assert lines == []
    with threads.blas_threads(env=dict(env, OMP_NUM_THREADS="2"), warn=lines.append):
        pass  # two threads on the one core it is bound to do oversubscribe it
    assert lines == [threads.oversubscription(1, 1, 2)]


def test_unbound_ranks_that_share_the_cores_are_still_warned_about(monkeypatch):
    fake_affinity(monkeypatch, {0}, {0})  # taskset -c 0 mpirun -n 2 ...: both ranks on core 0
    lines = []
    with threads.blas_threads(env={"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"},
                              warn=lines.append, work=threads.SMALL_WORK / 2):
        pass
    assert lines == [threads.oversubscription(1, 2, 1)]


def test_a_bound_rank_gets_the_threads_of_its_own_cores(monkeypatch):
    fake_affinity(monkeypatch, {0, 1, 2, 3}, set(range(16)))  # 4 ranks, each bound to 4 of 16 cores
    with threads.blas_threads(env={"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, work=threads.SMALL_WORK * 2) as count:
        assert count == 4


@pytest.mark.slow
def test_no_oversubscription_warning_under_open_mpis_default_binding(tmp_path):
    """`mpirun -n 2` of Open MPI binds each rank to a core: no warning (it said "2 rank(s) x 1 BLAS
    thread(s) on 1 core(s) oversubscribe this node")."""
    from singa_mpi.communication.launchers import LauncherNotFound, find_launcher

    try:
        open_mpi = find_launcher("openmpi")
    except LauncherNotFound as err:
        pytest.skip(str(err))
    if len(threads.os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores for Open MPI to bind 2 ranks to a core each")
    nets.make_data(str(tmp_path / "data.h5"), 32, (12,), 5)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(str(tmp_path / "data.h5"), 8, "data", 2, steps=2))
    options = [o for o in open_mpi.options if o not in ("--bind-to", "none", "--oversubscribe")]  # the default
    env = open_mpi.environ()
    for name in threads.THREAD_VARIABLES:
        env.pop(name, None)
    cmd = [open_mpi.executable, *options, "-n", "2", sys.executable, "-m", "singa_mpi", "train", str(conf),
           "--workspace", str(tmp_path / "ws")]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "oversubscribe" not in out.stderr, out.stderr


def test_deterministic_mode_computes_with_one_thread():
    """OpenBLAS's threads change a product's bits: every rank of a deterministic run uses one."""
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job

    cfg = load_job(str(ROOT / "conf" / "mnist_mlp.conf"))
    cfg.proto.deterministic.SetInParent()
    work = threads.work_per_step(cfg, validate(cfg))
    assert threads.choose_threads(16, 1, {}, work) == 1
    assert threads.choose_threads(16, 1, {"OMP_NUM_THREADS": "4"}, work) == 4  # the user still wins
