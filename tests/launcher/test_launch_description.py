"""The launch description (singa_mpi.launcher.describe): one pure computation from the job, the world
and the request, whose programs are the ones the ranks run; each rank reads and checks the job once."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
import warnings

import pytest

import nets
from singa_mpi.algorithms import make_algorithm
from singa_mpi.communication.local import LocalAbort, run_ranks
from singa_mpi.cost.auto import Choice, auto_layers
from singa_mpi.errors import ConfigError
from singa_mpi.launcher import Request, RunOptions
from singa_mpi.launcher import describe as describing
from singa_mpi.launcher.describe import World, describe, read_job, sync_method
from singa_mpi.launcher.run import run_parallel
from singa_mpi.planner.syncs import ALLREDUCE, METHODS, SHARED_MEMORY
from singa_mpi.program.build import SERVERS, programs
from singa_mpi.stop_signals import StopSignals

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _launch(job, size: int, options: RunOptions | None = None, command: str = "train", shared_memory=False):
    request = Request(job, lambda cfg: "ws", options or RunOptions(), command=command)
    return describe(read_job(request), World(size, 1, shared_memory), request)


@pytest.mark.parametrize("name", ["cifar10_hybrid", "digits_mlp", "rbm_digits_1", "char_rnn"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_the_description_is_pure_and_holds_the_programs_each_rank_runs(tmp_path, monkeypatch, name, size):
    """Computed twice, it is the same (the facts every rank votes on included); it writes nothing; its
    programs are each rank's program for the plan it holds, for every sync method."""
    monkeypatch.chdir(tmp_path)
    conf = str(ROOT / "conf" / f"{name}.conf")
    first, second = _launch(conf, size), _launch(conf, size)
    assert os.listdir(tmp_path) == []
    assert first.facts == second.facts and first.phases == second.phases
    if size == 1:  # the serial runtime runs the whole net: nothing to plan or vote on
        assert first.topo is None and first.programs is None and first.facts == ()
        return
    assert first.topo.world_size == size
    algorithm = make_algorithm(first.cfg.proto.train_one_batch)
    for phase in first.phases:
        for method in METHODS:
            built = programs(first.plans[phase], algorithm, method)
            assert first.programs.programs[(phase, method)] == built == second.programs.programs[(phase, method)]
    whats = [what for what, _ in first.facts]
    assert "the job" in whats and "the communication schedule (allreduce)" in whats


def test_the_facts_differ_where_ranks_must_not():
    conf = str(ROOT / "conf" / "digits_mlp.conf")
    base = dict(_launch(conf, 2).facts)
    seeded = dict(_launch(conf, 2, RunOptions(seed=99)).facts)
    assert seeded["the seed (--seed, else the job's seed)"] == "99" != base["the seed (--seed, else the job's seed)"]
    assert seeded["the job"] != base["the job"]  # the seed is part of the job the ranks run
    resumed = dict(_launch(conf, 2, RunOptions(resume=True)).facts)
    assert resumed["--resume"] == "True" and base["--resume"] == "False"
    assert _launch(conf, 3).facts != _launch(conf, 2).facts  # the schedules differ


def test_the_sync_method_follows_the_topology_and_the_world():
    allreduce, sandblaster, hogwild = (_launch(str(ROOT / "conf" / f"digits_{name}.conf"), size, shared_memory=True)
                                       for name, size in (("allreduce", 3), ("sandblaster", 5), ("hogwild", 3)))
    assert allreduce.programs.method == SHARED_MEMORY
    assert _launch(str(ROOT / "conf" / "digits_allreduce.conf"), 3).programs.method == ALLREDUCE  # no shm
    assert sandblaster.programs.method == SERVERS and (("train", SERVERS) in sandblaster.programs.programs)
    assert hogwild.programs.method == ALLREDUCE  # its exchanges write every replica: no node-shared chunks
    assert sync_method(allreduce.topo, World(3, 2, shared_memory=False)) == ALLREDUCE


def test_test_runs_every_rank_as_one_group_and_train_refuses_a_test_only_job():
    sandblaster = _launch(str(ROOT / "conf" / "digits_sandblaster.conf"), 3, command="test")
    assert sandblaster.phases == ("test",) and not sandblaster.topo.servers_separate
    assert len(sandblaster.topo.worker_groups) == 1 and sandblaster.topo.workers_per_group == 3
    with pytest.raises(ConfigError, match="expected test_steps > 0 for `test`"):
        cfg = nets.job(nets.mlp("x.h5", 8, "data"))
        cfg.proto.test_steps = 0
        _launch(cfg, 2, command="test")


def test_the_callers_config_is_not_changed_by_following_the_launched_count():
    cfg = nets.job(nets.mlp("x.h5", 8, "data") + "\ncluster { nworkers_per_group: 2 }\n")
    launched = _launch(cfg, 3)
    assert launched.cfg.proto.cluster.nworkers_per_group == 3 and cfg.proto.cluster.nworkers_per_group == 2
    assert launched.notes[0].endswith("running on the 3 launched rank(s)")


def test_one_process_says_it_runs_the_whole_net_and_refuses_workers_it_does_not_have():
    """Without a launcher, a job whose cluster asks for several processes trained serially without a
    word, and `--workers 3` was ignored (under mpirun -n 2 the one is a note, the other an error)."""
    sandblaster = _launch(str(ROOT / "conf" / "digits_sandblaster.conf"), 1)
    assert sandblaster.topo is None and len(sandblaster.notes) == 1
    assert "cluster nworkers_per_group = 3, nservers_per_group = 2, server_worker_separate = true in the job; " \
           "running as one process" in sandblaster.notes[0]
    assert _launch(str(ROOT / "conf" / "digits_mlp.conf"), 1).notes == ()
    assert _launch(str(ROOT / "conf" / "digits_mlp.conf"), 1, RunOptions(workers=1)).notes == ()
    with pytest.raises(ConfigError, match=r"^--workers 3: expected the number of MPI ranks \(1: no launcher"):
        _launch(str(ROOT / "conf" / "digits_mlp.conf"), 1, RunOptions(workers=3))


def test_one_process_names_mpiexec_the_launcher_every_mpi_has():
    """The one-process notes said "launch with mpirun -n N", a command MPICH's users may not have (its
    launcher is mpiexec, which Open MPI has too); the other launch hints already say mpiexec."""
    sandblaster = _launch(str(ROOT / "conf" / "digits_sandblaster.conf"), 1)
    assert sandblaster.notes[0].endswith("(launch with mpiexec -n N to run the cluster it describes)")
    with pytest.raises(ConfigError, match=r"; launch with mpiexec -n 3 or leave --workers out$"):
        _launch(str(ROOT / "conf" / "digits_mlp.conf"), 1, RunOptions(workers=3))


def test_each_rank_reads_and_checks_the_job_once_and_takes_rank_0s_auto_choice(tmp_path, monkeypatch):
    """Under MPI (here 2 ranks on threads), phase 1 reads the job once per rank, rank 0 alone chooses
    the `auto` layers, and every rank's net runs the program the description proved."""
    data = nets.make_data(str(tmp_path / "d.h5"), 32, (12,), 5)
    conf = tmp_path / "auto.conf"
    conf.write_text(nets.mlp(data, 8, "data", steps=1).replace("neuralnet { partition_dim: 0",
                                                               "neuralnet { partition_dim: auto", 1))
    reads, choices = [], []
    original_load, original_validate = describing.load_job, describing.validate
    monkeypatch.setattr(describing, "load_job", lambda path: reads.append(threading.get_ident()) or original_load(path))
    monkeypatch.setattr(describing, "validate", lambda cfg: reads.append(-1) or original_validate(cfg))

    def choose(cfg, nworkers, method, nodes, pipelines):
        choices.append(nworkers)
        assert pipelines  # a net whose every layer is auto may become a pipeline
        return Choice({name: 1 if name.startswith(("fc", "act")) else 0 for name in auto_layers(cfg)}, 0.1, None, 1, 0)
    monkeypatch.setattr("singa_mpi.cost.auto.choose_for_job", choose)
    seen = {}

    def body(trainer, initial):
        net = trainer.runtime.build_net("train")
        seen[trainer.runtime.rank] = (net.program, trainer.runtime.programs, trainer.cfg)
        return 0

    request = Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions())
    codes = run_ranks(2, lambda comm: run_parallel(comm, request, body, StopSignals(), None), timeout=120)
    assert codes == [0, 0]
    assert len([r for r in reads if r != -1]) == 2 and len(set(r for r in reads if r != -1)) == 2  # once per rank
    assert reads.count(-1) == 2 and choices == [2]  # checked once per rank; rank 0 alone chose
    for rank, (program, launched, cfg) in seen.items():
        assert program == launched.program("train", launched.method, rank)
        dims = {layer.name: layer.partition_dim for layer in cfg.proto.neuralnet.layer}
        assert dims["fc1"] == 1 and dims["fc3"] == 1


def test_rank_0s_auto_choice_may_be_a_pipeline_that_every_rank_runs(tmp_path, monkeypatch):
    """A net whose every layer is `auto`, for which the cost model chose a pipeline: every rank plans
    the stages and micro-batches rank 0 chose and runs its part of the pipelined program."""
    data = nets.make_data(str(tmp_path / "d.h5"), 32, (12,), 5)
    conf = tmp_path / "auto.conf"
    conf.write_text(nets.mlp(data, 8, "data", steps=1).replace("neuralnet { partition_dim: 0",
                                                               "neuralnet { partition_dim: auto", 1))

    def choose(cfg, nworkers, method, nodes, pipelines):
        names = [layer.name for layer in cfg.proto.neuralnet.layer]
        return Choice(dict.fromkeys(names, -1), 0.1, None, 1, 0, "test",
                      {name: int(i >= 4) for i, name in enumerate(names)}, ("1f1b", 2))
    monkeypatch.setattr("singa_mpi.cost.auto.choose_for_job", choose)
    seen = {}

    def body(trainer, initial):
        net = trainer.runtime.build_net("train")
        seen[trainer.runtime.rank] = (net.program, trainer.runtime.pipeline())
        return 0

    request = Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions())
    codes = run_ranks(2, lambda comm: run_parallel(comm, request, body, StopSignals(), None), timeout=120)
    assert codes == [0, 0]
    for rank, (program, pipeline) in seen.items():
        assert pipeline == ("1f1b", 2, 2, pytest.approx(1 / 3))  # the bubble (S-1)/(M+S-1)
        assert any(line.endswith("/mb1") for line in program.lines())


def test_rank_0s_error_choosing_is_the_error_every_rank_reports_said_once(tmp_path, monkeypatch, capsys):
    """Rank 0's choice failed (too few rows for the workers, a CD job): every rank used to say only
    "partition_dim: auto was not resolved ... (it failed on rank 0; see its message)", and no rank
    printed that message."""
    data = nets.make_data(str(tmp_path / "d.h5"), 32, (12,), 5)
    conf = tmp_path / "auto.conf"
    conf.write_text(nets.mlp(data, 8, "data", steps=1).replace("neuralnet { partition_dim: 0",
                                                               "neuralnet { partition_dim: auto", 1))

    def choose(cfg, nworkers, method, nodes, pipelines):
        raise ConfigError("auto.conf:3:5: partition_dim = auto: no plan fits: expected something else")
    monkeypatch.setattr("singa_mpi.cost.auto.choose_for_job", choose)
    request = Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions())
    codes = run_ranks(2, lambda comm: run_parallel(comm, request, lambda *_: 0, StopSignals(), None), timeout=120)
    assert codes == [ConfigError.exit_code] * 2
    err = capsys.readouterr().err
    assert err.count("singa-mpi: error: auto.conf:3:5: partition_dim = auto: no plan fits") == 1, err
    assert "not resolved" not in err


def test_the_launch_path_takes_few_parameters():
    """No function of the launch path takes more than 6 parameters (the launcher used to pass closures
    through functions of 11 and 13)."""
    import inspect

    from singa_mpi import launcher, test_command
    from singa_mpi.runtimes import roles

    modules = [getattr(launcher, name) for name in ("options", "describe", "checks", "vote", "start", "run",
                                                    "train")] + [test_command, roles]
    for module in modules:
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__:
                count = len(inspect.signature(function).parameters)
                assert count <= 6, f"{module.__name__}.{name} takes {count} parameters"


def test_a_launch_is_frozen():
    launched = _launch(str(ROOT / "conf" / "digits_mlp.conf"), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        launched.workspace = "elsewhere"


def test_a_bug_in_rank_0s_choice_ends_every_rank_and_says_where(tmp_path, capfd):
    """Phase 1's vote carries bad input; a bug before it (here in rank 0's `auto` choice, while rank 1
    waits for that choice) ends the whole job at once, naming the rank and where, rather than leaving
    rank 0 to exit into MPI_Finalize while the others wait (under MPI: a hang until the launcher is killed)."""
    data = nets.make_data(str(tmp_path / "d.h5"), 32, (12,), 5)
    conf = tmp_path / "auto.conf"
    conf.write_text(nets.mlp(data, 8, "data", steps=1).replace("neuralnet { partition_dim: 0",
                                                               "neuralnet { partition_dim: auto", 1))

    def choose(cfg, nworkers, method, nodes, pipelines):
        return 1 / 0

    request = Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("singa_mpi.cost.auto.choose_for_job", choose)
        with pytest.raises(LocalAbort, match=r"rank 0 called abort\(1\)"):
            run_ranks(2, lambda comm: run_parallel(comm, request, lambda trainer, initial: 0, StopSignals(), None),
                      timeout=120)
    err = capfd.readouterr().err
    assert err.startswith("singa-mpi: rank 0: error at step 0: ZeroDivisionError: division by zero\n"), err
    assert "in choose" in err and "Traceback" in err  # a bug: where it happened


@pytest.mark.parametrize("scheme, size, said", [
    ("data", 1, "has no effect on 1 worker: the step runs unpipelined"),
    ("data", 2, "'s schedule has no effect: every worker starts at the net's first layer, so the net is one stage "
                "and each worker runs its 2 micro-batches one after another"),
    ("stages", 2, None),  # two stages: the schedule overlaps them
])
def test_a_pipeline_that_does_nothing_is_noted_once_at_the_start(tmp_path, scheme, size, said):
    """`pipeline { micro_batches: 2 }` trained on one worker, or on workers that each hold every layer,
    ran without a word that it changed nothing; the launch notes it (rank 0 prints the notes)."""
    conf = tmp_path / "job.conf"
    conf.write_text(nets.pipelined(nets.mlp(str(nets.make_data(str(tmp_path / "d.h5"), 128, (12,), 5)), 64, scheme),
                                   2))
    notes = [note for note in _launch(str(conf), size).notes if "neuralnet.pipeline" in note]
    if said is None:
        assert notes == []
        return
    assert len(notes) == 1 and notes[0].startswith(f"note: {conf}:") and said in notes[0], notes


def test_reading_the_job_warns_of_its_values_as_check_does(tmp_path):
    """A job's warning about a value (an updater's delta 0) is said by train too, through warnings (rank 0
    says it once), not by test, which updates nothing; check's warnings about missing files are not: a run
    reports those itself."""
    text = (ROOT / "conf" / "digits_mlp.conf").read_text().replace("type: kSGD\n  momentum: 0.9\n",
                                                                   "type: kAdaGrad\n  delta: 0\n")
    conf = tmp_path / "job.conf"
    conf.write_text(text)
    with pytest.warns(UserWarning) as said:
        _cfg, summary = read_job(Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions()))
    lines = [str(warning.message) for warning in said]
    assert lines == [f"{conf}:16:3: updater.delta = 0: kAdaGrad divides each step by its history plus delta, so a "
                     f"weight whose gradient is exactly 0 so far (an input that is always 0, a unit that never fires) "
                     f"gets 0/0 = NaN; expected a small positive delta (default 1e-08)"]
    assert lines[0] in summary.warnings  # what check prints
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_job(Request(str(conf), lambda cfg: str(tmp_path / "ws"), RunOptions(), command="test"))
