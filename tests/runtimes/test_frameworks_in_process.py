"""SINGA's server frameworks in one process: every rank a thread on the single-process communicator
(LocalComm), each running its role as the launcher does (:func:`singa_mpi.runtimes.roles.run_role`).

Sandblaster (one synchronous group beside server ranks) must train the serial run's numbers; the
asynchronous frameworks cannot (their updates interleave as the threads run), so Downpour and both
Hogwilds (distributed: groups exchange their changes; in memory: groups share one copy) must
converge: over the same number of steps, their training loss must fall at least half as far as the
serial run's, from the serial run's start (the same starting values).  Their MPI tests are
tests/runtimes/test_frameworks.py and tests/mpi/test_servers.py.
"""
import pathlib
import re
import signal

import numpy as np
import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.communication.local import run_ranks
from singa_mpi.config.load import load_job
from singa_mpi.errors import NonFiniteError
from singa_mpi.launcher.checks import check_inputs
from singa_mpi.launcher.describe import World, describe, read_job
from singa_mpi.launcher.options import Request
from singa_mpi.workspace import make_workspace
from singa_mpi.runtimes.roles import RoleHooks, RoleJob, run_role
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 120  # of each worker group (the asynchronous ones)


def framework_job(name: str, steps: int, workspace: pathlib.Path, share_memory: bool | None = None):
    """conf/digits_<name>.conf training ``steps`` steps without tests or checkpoints, its digits
    prepared under the current folder."""
    cfg = load_job(ROOT / "conf" / f"digits_{name}.conf")
    job = cfg.proto
    job.train_steps, job.test_steps, job.validate_steps, job.disp_freq = steps, 0, 0, 1
    job.ClearField("checkpoint_freq")
    if share_memory is not None:
        job.cluster.share_memory = share_memory
    check_inputs(cfg, str(workspace), ["train"], log=None)
    make_workspace(str(workspace))
    return cfg


def run_in_threads(cfg, workspace: pathlib.Path, resume: checkpoint.Checkpoint | None = None,
                   prepare=lambda trainer: None, serving=lambda server: None) -> list:
    """Every rank of the job's cluster as a thread; each worker's trainer (None for a server).
    ``resume``: a checkpoint every worker restores in full first, as --resume does; ``prepare(trainer)``:
    called on each worker's trainer before it trains; ``serving(server)``: on each server's runtime
    before it serves (as the launcher hands it to the stop signals)."""
    size = cfg.proto.cluster.nworker_groups * cfg.proto.cluster.nworkers_per_group
    if cfg.proto.cluster.server_worker_separate:
        size += cfg.proto.cluster.nserver_groups * cfg.proto.cluster.nservers_per_group
    request = Request(cfg, lambda _: str(workspace))
    launch = describe(read_job(request), World(size), request)  # as every launched rank computes it
    job = RoleJob(launch.cfg, launch.topo, launch.programs, launch.workspace)
    trainers = [None] * size

    def rank(comm):
        def body(trainer: Trainer) -> int:
            trainers[comm.rank] = trainer
            trainer.log, trainer.live_bar = (lambda line: None), False
            if resume is not None:
                trainer.restore(resume, full=True)
            trainer.runtime.begin_training(trainer.loaded, True)
            prepare(trainer)
            trainer.run()
            return 0
        def attach(runtime) -> None:
            if not isinstance(runtime, Trainer):
                serving(runtime)

        return run_role(comm, job, body, RoleHooks(attach=attach))

    assert run_ranks(size, rank, timeout=240.0) == [0] * size
    return trainers


def losses(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.history if entry.get("phase") == "train" and "loss" in entry]


def serial_run(cfg, workspace: pathlib.Path) -> Trainer:
    make_workspace(str(workspace))
    serial = Trainer(cfg, str(workspace), SerialRuntime(cfg, cfg.proto.seed, str(workspace)), log=lambda line: None)
    serial.live_bar = False
    serial.run()
    return serial


def test_sandblaster_in_process_trains_the_serial_numbers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = framework_job("sandblaster", 4, tmp_path / "ws")
    trainers = run_in_threads(cfg, tmp_path / "ws")
    workers = [t for t in trainers if t is not None]
    assert len(workers) == cfg.proto.cluster.nworkers_per_group
    serial = serial_run(cfg, tmp_path / "serial")
    assert np.allclose(losses(workers[0]), losses(serial), rtol=1e-4, atol=1e-5), (losses(workers[0]), losses(serial))
    # the servers' values came back to every worker: each holds the serial run's params
    expected = {p.name: p.data for p in serial.train_net.params}
    for worker in workers:
        for param in worker.train_net.params:
            whole = expected[param.name][tuple(slice(lo, hi) for lo, hi in param.shard)] if param.shard else \
                expected[param.name]
            np.testing.assert_allclose(param.data, whole, rtol=1e-4, atol=1e-5, err_msg=param.name)


def test_sandblaster_resumed_twice_keeps_every_servers_updater_counters(tmp_path, monkeypatch):
    """Each server counts the updates of its own ranges (Adam's bias correction): a resume hands
    every server every param's counter, and a server's copy of another server's param, never
    updated, once overwrote the true count in the next checkpoint, so a second resume went wrong."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job("sandblaster", 2, tmp_path / "ws")
    cfg.proto.updater.type = "kAdam"
    cfg.proto.updater.adam_conf.bias_correction = True
    run_in_threads(cfg, tmp_path / "ws")
    assert cfg.proto.cluster.nservers_per_group == 2
    for steps in (4, 6):
        cfg.proto.train_steps = steps
        run_in_threads(cfg, tmp_path / "ws", resume=checkpoint.newest_good(str(tmp_path / "ws")))
        written = checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "ws"), steps))
        assert written.counters == {name: {"steps": steps} for name in written.params}, written.counters


def test_in_memory_hogwild_groups_stop_when_one_group_is_asked_to(tmp_path, monkeypatch):
    """A stop signal that reaches one group's rank alone: the groups share no step and take no vote,
    so the other group trained on to its last step; the stop word in the shared copy stops it too."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job("hogwild", 5000, tmp_path / "ws", share_memory=True)

    def signalled_in_group_1(trainer):
        trainer.stop_requested = trainer.runtime.place.role.group == 1

    trainers = run_in_threads(cfg, tmp_path / "ws", prepare=signalled_in_group_1)
    assert all(t.stopped for t in trainers), [(t.runtime.place.role.group, t.stopped) for t in trainers]
    (step, _), *_ = checkpoint.listed(str(tmp_path / "ws"))
    assert step < 5000


@pytest.mark.slow
@pytest.mark.parametrize("name, share_memory", [("downpour", None), ("hogwild", True), ("hogwild", False)],
                         ids=["downpour", "hogwild-in-memory", "hogwild-distributed"])
def test_asynchronous_frameworks_in_process_converge(tmp_path, monkeypatch, name, share_memory):
    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, STEPS, tmp_path / "ws", share_memory)
    trainers = run_in_threads(cfg, tmp_path / "ws")
    group_zero = next(t for t in trainers if t is not None and t.runtime.is_root)
    curve, reference = losses(group_zero), losses(serial_run(cfg, tmp_path / "serial"))
    assert len(curve) == len(reference) == STEPS
    # from the serial run's first losses: every group starts from its values (the same seed), but group
    # zero's own first steps may come after the other groups' (threads run unevenly: with one BLAS
    # thread its first loss was once 1.41, the others had trained it, where the serial run's is 2.3)
    start = np.mean(reference[:5])
    fell, serial_fell = start - np.mean(curve[-5:]), start - np.mean(reference[-5:])
    assert serial_fell > 0.5 and fell > 0.5 * serial_fell, \
        f"{name}: the loss fell by {fell:.3f} over {STEPS} steps, the serial run's by {serial_fell:.3f}"


@pytest.mark.parametrize("name,writers", [
    ("downpour", "written by 6 rank(s) (Downpour: 2 worker group(s) x 2 worker(s) + 2 server(s))"),
    ("hogwild", "written by 3 rank(s) (Hogwild: 3 worker group(s) x 1 worker(s))")])
def test_ckpt_inspect_names_every_rank_of_a_framework_job(tmp_path, monkeypatch, name, writers):
    """`ckpt inspect` said "written by 2 worker(s)" of a Downpour job of 6 ranks: one group's workers."""
    from singa_mpi.checkpoints.tools import inspect

    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, 2, tmp_path / "ws")
    run_in_threads(cfg, tmp_path / "ws")
    path = checkpoint.checkpoint_path(str(tmp_path / "ws"), 2)
    assert writers in inspect(path).splitlines()[0]
    assert checkpoint.read(path).nranks == int(writers.split()[2])


@pytest.mark.parametrize("name,share_memory,where", [
    ("sandblaster", None, "server"), ("downpour", None, "server"), ("downpour", None, "group 1"),
    ("hogwild", True, "group 1"), ("hogwild", False, "group 1")])
def test_a_stop_signal_that_reached_a_server_or_another_group_is_named_and_acknowledged_by_the_root(
        tmp_path, monkeypatch, name, share_memory, where):
    """A SIGTERM that reached a server rank or a worker of another group alone stopped the job with a
    checkpoint, but stopped.txt said "stopped on a signal after N steps" without naming it, and rank 0
    said nothing at once (as it does for a signal of its own).  The signal travels with the stop now."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, 5000, tmp_path / "ws", share_memory=share_memory)
    acknowledged = []

    def prepare(trainer):
        if trainer.runtime.is_root:
            trainer.acknowledge = acknowledged.append
        if where == "group 1" and trainer.runtime.place.role.group == 1 and trainer.runtime.rank == 0:
            trainer.stop_requested, trainer.stop_signal = True, signal.SIGTERM

    def serving(server):
        if where == "server" and server.role.index == 0:
            server.stop_requested, server.stop_signal = True, signal.SIGTERM

    trainers = run_in_threads(cfg, tmp_path / "ws", prepare=prepare, serving=serving)
    root = next(t for t in trainers if t is not None and t.runtime.is_root)
    assert root.stopped and root.stop_signal == signal.SIGTERM
    assert acknowledged == [signal.SIGTERM]
    (step, path), *_ = checkpoint.listed(str(tmp_path / "ws"))
    assert step < 5000
    assert (tmp_path / "ws" / "stopped.txt").read_text().startswith(
        f"stopped on a signal (SIGTERM) after {step} steps: checkpoint {path}")


def test_a_downpour_update_that_overflows_on_the_server_is_named_with_its_value(tmp_path, monkeypatch):
    """With a learning rate of 1e30 the servers' first update turns finite gradients into infinite
    values: the worker said its gradient "holds 0.0" (the first value of its finite gradient); it names
    the value the server's update made now, as a serial run does."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job("downpour", 4, tmp_path / "ws")
    cfg.proto.updater.learning_rate.base_lr = 1e30
    said = []

    def prepare(trainer):
        run = trainer.run

        def stopping():
            try:
                return run()
            except NonFiniteError as err:
                said.append(str(err))
                return {}
        trainer.run = stopping

    run_in_threads(cfg, tmp_path / "ws", prepare=prepare)
    found = [line for line in said if "another worker group" not in line and "see rank 0" not in line]
    assert found and not any("holds 0.0" in line for line in said), said
    overflowed = [line for line in found if re.match(r"non-finite value at step 0 \(train\)[^:]*: param '\w+' "
                                                     r"\(layer '\w+'\) holds -?inf after the update on its server "
                                                     r"\(its gradient was finite\): ", line)]
    # the groups run asynchronously: a group that pulled the overflowed values before its own update
    # finds them in its next loss, which is as true
    later = [line for line in found if re.match(r"non-finite value at step [1-9]\d* \(train\)[^:]*: loss layer "
                                                r"'loss': loss = nan: ", line)]
    assert overflowed and len(overflowed) + len(later) == len(found), found


@pytest.mark.parametrize("name, share_memory", [("downpour", None), ("hogwild", False), ("hogwild", True)],
                         ids=["downpour", "hogwild", "hogwild-in-memory"])
def test_non_finite_values_in_several_groups_are_one_line_for_the_job(tmp_path, monkeypatch, capsys, name,
                                                                      share_memory):
    """A diverging job of two worker groups printed a line per group that found a NaN (each group's
    root its own); the job's root now prints one line, naming the groups, and every rank exits 5."""
    from singa_mpi.launcher.options import RunOptions
    from singa_mpi.launcher.train import train

    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, 40, tmp_path / "ws", share_memory=share_memory)
    cfg.proto.updater.learning_rate.base_lr = 1e8
    cfg.proto.test_steps, cfg.proto.test_freq = 1, 20  # group 0 also tests the values the groups share
    size = cfg.proto.cluster.nworker_groups * cfg.proto.cluster.nworkers_per_group
    if cfg.proto.cluster.server_worker_separate:
        size += cfg.proto.cluster.nserver_groups * cfg.proto.cluster.nservers_per_group
    request = Request(cfg, lambda _: str(tmp_path / "ws"))
    launch = describe(read_job(request), World(size), request)
    job = RoleJob(launch.cfg, launch.topo, launch.programs, launch.workspace)

    def rank(comm):
        def body(trainer):
            trainer.log, trainer.live_bar = (lambda line: None), False
            return train(trainer, RunOptions())
        return run_role(comm, job, body)

    assert run_ranks(size, rank, timeout=240.0) == [NonFiniteError.exit_code] * size
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("singa-mpi: error:")]
    assert len(lines) == 1, lines
    assert re.match(r"singa-mpi: error: non-finite value at step \d+ \((train|test)\)( on rank \d)? in worker "
                    r"group \d: .*: stopped without checkpointing it \(no checkpoint was written\); ", lines[0]), lines


def test_a_hogwild_overflow_found_only_at_a_stop_is_in_the_vote_and_no_group_checkpoints_it(tmp_path, monkeypatch):
    """Distributed Hogwild, a stop signal in group 1 and, at that step, an overflow in group 1's values
    (its gradients finite): found only by the look at the values that a stop's checkpoint takes, after
    the exchange vote.  Group 1 stopped on it, but group 0 took group 1's change in the last exchange and
    wrote it as a checkpoint 'stopped on a signal'.  The look is now part of the vote: every group stops
    on the finding, and no checkpoint is written."""
    from singa_mpi.errors import NonFiniteError
    from singa_mpi.sync.hogwild import GroupDeltaSync

    monkeypatch.chdir(tmp_path)
    cfg = framework_job("hogwild", 5000, tmp_path / "ws", share_memory=False)
    publish = GroupDeltaSync.publish

    def overflowing_publish(self):
        if self.world.rank == 1 and self.step == 3:  # group 1's third update overflowed its first value
            self.views[0][0] = np.float32("inf")
        publish(self)

    monkeypatch.setattr(GroupDeltaSync, "publish", overflowing_publish)
    raised = {}

    def prepare(trainer):
        group = trainer.runtime.place.role.group
        run = trainer.run

        def stop_at_step_3_in_group_1(step):
            Trainer.train_one_batch(trainer, step)
            if group == 1 and step == 2:
                trainer.stop_requested, trainer.stop_signal = True, signal.SIGTERM

        def caught():
            try:
                run()
            except NonFiniteError as err:
                raised[group] = str(err)

        trainer.train_one_batch, trainer.run = stop_at_step_3_in_group_1, caught

    trainers = run_in_threads(cfg, tmp_path / "ws", prepare=prepare)
    assert sorted(raised) == [0, 1, 2], (raised, [t.stopped for t in trainers])
    assert "worker group 1" in raised[1] and "another worker group" in raised[0], raised
    assert checkpoint.listed(str(tmp_path / "ws")) == [] and not any(t.stopped for t in trainers)


def train_readers(trainer: Trainer) -> dict[str, int]:
    """The batches each training input layer of this worker has read."""
    return {layer.name: layer.batches for layer in trainer.train_net.layers if hasattr(layer, "batches")}


@pytest.mark.parametrize("name, share_memory", [("downpour", None), ("hogwild", True)],
                         ids=["downpour", "hogwild-in-memory"])
def test_each_worker_group_resumes_from_its_own_reader_position(tmp_path, monkeypatch, name, share_memory):
    """Groups that go at their own pace held only group 0's reader position in a checkpoint, and a resume
    started every group from it: a group that had read more read those batches again.  The checkpoint
    now holds each group's position (ahead<g>: its batches beyond group 0's), and each group resumes from
    its own."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, 2, tmp_path / "ws", share_memory)
    run_in_threads(cfg, tmp_path / "ws")
    ckpt = checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "ws"), 2))
    (reader, state), = ckpt.readers["train"].items()
    groups = cfg.proto.cluster.nworker_groups
    # group 1 had read 3 batches more than group 0 when this was written, the others as many
    ckpt.readers["train"][reader] = {"batches": 2, "groups": groups, "ahead1": 3}
    cfg.proto.train_steps = 4
    trainers = run_in_threads(cfg, tmp_path / "ws", resume=ckpt)
    for trainer in (t for t in trainers if t is not None):
        group = trainer.runtime.place.role.group
        assert train_readers(trainer) == {reader: 2 + 2 + (3 if group == 1 else 0)}, group
    again = checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "ws"), 4)).readers["train"][reader]
    if name == "downpour":  # the last checkpoint waits for every group: each trained its 2 steps
        assert again == {"batches": 4, "groups": groups, "ahead1": 3}
    else:  # in memory, group 0's last checkpoint waits for none: the others had trained 0 to 2 steps then
        assert again["batches"] == 4 and 1 <= again.get("ahead1", 0) <= 3, again
        assert all(-2 <= again.get(f"ahead{g}", 0) <= 0 for g in range(2, groups)), again


@pytest.mark.parametrize("name, share_memory", [("downpour", None), ("hogwild", True)],
                         ids=["downpour", "hogwild-in-memory"])
def test_a_stop_s_checkpoint_holds_every_group_s_reader_position(tmp_path, monkeypatch, name, share_memory):
    """Group 1 stops after its first step, the others after the step they are in: the stop's checkpoint
    holds where each group's reader is (group 0's batches, and ahead<g> for a group elsewhere).  In
    memory, group 0's checkpoint waits for no other group: one may read a batch more before it stops."""
    monkeypatch.chdir(tmp_path)
    cfg = framework_job(name, 5000, tmp_path / "ws", share_memory)

    def stopped_in_group_1(trainer):
        trainer.stop_requested = trainer.runtime.place.role.group == 1 and trainer.runtime.rank == 0

    trainers = run_in_threads(cfg, tmp_path / "ws", prepare=stopped_in_group_1)
    (step, path), *_ = checkpoint.listed(str(tmp_path / "ws"))
    (reader, state), = checkpoint.read(path).readers["train"].items()
    assert state["batches"] == step
    for trainer in (t for t in trainers if t is not None):
        group = trainer.runtime.place.role.group
        read_after = train_readers(trainer)[reader] - state["batches"] - state.get(f"ahead{group}", 0)
        assert read_after == 0 or (name == "hogwild" and group > 1 and read_after == 1), (group, state, read_after)
