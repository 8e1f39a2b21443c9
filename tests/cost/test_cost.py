"""The cost model (singa_mpi.cost): kernel timing and its cache, the step replay, automatic partitioning.

The replay and the search are checked with made-up kernel times and rates (exact arithmetic); the
kernel timer and the calibration fit run for real on tiny shapes.
"""
import dataclasses
import math
import os

import pytest

import nets
from cost_support import RowKernels, rates
from singa_mpi.cost import rates as rate_module
from singa_mpi.cost.auto import choose, with_dims
from singa_mpi.cost.kernels import KernelTimes, signature
from singa_mpi.cost.model import UPDATE_PASSES, predict
from singa_mpi.cost.rates import Link, Network
from singa_mpi.planner import ALLREDUCE, SHARED_MEMORY, plan


@pytest.fixture
def mlp_cfg(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    return nets.job(nets.mlp(data, 16, "data", 2))


def test_a_serial_step_is_its_kernels_and_its_update(mlp_cfg):
    the_plan = plan(mlp_cfg, 1)
    cost = predict(the_plan, SHARED_MEMORY, RowKernels(), rates())
    outputs = [math.prod(s.out_shape) * 1e-6 for s in the_plan.sublayers if s.exchange is None and s.srcs]
    backward = [math.prod(s.out_shape) * 1e-6 for s in the_plan.sublayers if s.exchange is None and s.needs_grad]
    source = sum(2 * 4 * math.prod(s.out_shape) / 1e10 for s in the_plan.sublayers if not s.srcs)
    params = sum(p.size for s in the_plan.sublayers for p in s.params)
    update = UPDATE_PASSES * 4 * params / 1e10
    assert cost.step == pytest.approx(sum(outputs) + sum(backward) + source + update)


def test_data_parallel_halves_the_kernels_and_adds_the_sync(mlp_cfg):
    serial = predict(plan(mlp_cfg, 1), SHARED_MEMORY, RowKernels(), rates())
    two = predict(plan(mlp_cfg, 2, method=ALLREDUCE), ALLREDUCE, RowKernels(), rates(allreduce_bw=1e6))
    assert two.compute == pytest.approx(serial.compute / 2, rel=0.05)
    assert two.sync > 0 and two.step > two.compute
    faster_sync = predict(plan(mlp_cfg, 2, method=ALLREDUCE), ALLREDUCE, RowKernels(), rates(allreduce_bw=1e12))
    assert faster_sync.step < two.step


def test_a_pipeline_receiver_waits_for_its_sender(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    the_plan = plan(nets.job(nets.mlp(data, 16, "pipeline", 2)), 2)
    slow_link = predict(the_plan, SHARED_MEMORY, RowKernels(), rates(p2p_bw=1e5))
    fast_link = predict(the_plan, SHARED_MEMORY, RowKernels(), rates(p2p_bw=1e12))
    assert slow_link.step > fast_link.step
    assert sum(c.comm for c in slow_link.layers) > 0


def test_messages_between_nodes_take_the_network_rates_and_within_a_node_the_local_ones(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    pipeline = plan(nets.job(nets.mlp(data, 16, "pipeline", 2)), 2)  # a bridge from rank 0 to rank 1
    fast, slow = rates(p2p_bw=1e12), rates(p2p_bw=1e5)
    one_node = predict(pipeline, SHARED_MEMORY, RowKernels(), Network(fast, slow, per_node=2))
    two_nodes = predict(pipeline, ALLREDUCE, RowKernels(), Network(fast, slow, per_node=1))
    assert one_node.step == pytest.approx(predict(pipeline, SHARED_MEMORY, RowKernels(), fast).step)
    assert two_nodes.step == pytest.approx(predict(pipeline, ALLREDUCE, RowKernels(), slow).step)
    assert two_nodes.step > one_node.step
    assert "between nodes (1 ranks per node)" in two_nodes.rates_source


def test_an_allreduce_spanning_nodes_runs_at_the_network_pace(mlp_cfg):
    the_plan = plan(mlp_cfg, 4, method=ALLREDUCE)
    local, remote = rates(allreduce_bw=1e12), rates(allreduce_bw=1e6)
    within = predict(the_plan, ALLREDUCE, RowKernels(), Network(local, remote, per_node=4))
    across = predict(the_plan, ALLREDUCE, RowKernels(), Network(local, remote, per_node=2))
    assert across.sync > within.sync
    assert across.step == pytest.approx(predict(the_plan, ALLREDUCE, RowKernels(), remote).step)
    network = Network(local, remote, per_node=2)
    assert [network.node(r) for r in range(4)] == [0, 0, 1, 1]
    assert network.among((0, 1)) is local and network.among((1, 2)) is remote


def test_kernels_are_timed_once_and_read_back_from_the_cache(mlp_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    the_plan = plan(mlp_cfg, 2)
    first = KernelTimes()
    times = {s.name: first.of(the_plan, s) for s in the_plan.sublayers if s.exchange is None and s.srcs}
    assert first.measured == len({signature(the_plan, s) for s in the_plan.sublayers
                                  if s.exchange is None and s.srcs})
    assert all(t.forward > 0 for t in times.values())
    assert all(times[s.name].backward > 0 for s in the_plan.sublayers if s.params)
    first.save()
    second = KernelTimes()
    again = {s.name: second.of(the_plan, s) for s in the_plan.sublayers if s.exchange is None and s.srcs}
    assert second.measured == 0 and again == times
    assert KernelTimes(recalibrate=True).mine == {}


@pytest.mark.parametrize("damage", ["top level a list", "machine entry a list", "times of strings",
                                    "negative times", "too few times", "not finite", "weights over backward"])
def test_a_damaged_kernel_cache_is_timed_afresh_not_read_as_prices(mlp_cfg, tmp_path, monkeypatch, damage):
    """A kernels.json of valid JSON but another shape (a list, an entry of strings, two numbers, a negative
    time) was a traceback (AttributeError, TypeError) or a step predicted at -12000 ms; what is not three
    finite times >= 0 is now timed again (and written back whole)."""
    import json

    from singa_mpi.cost import kernels

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_measure", lambda spec, beside=None, cold=False: (1e-3, 3e-3, 1e-3))
    the_plan = plan(mlp_cfg, 1)
    fc = next(s for s in the_plan.sublayers if s.params)
    times = KernelTimes()
    key = signature(the_plan, fc)
    table = {"top level a list": [1, 2], "machine entry a list": {times.machine: [1, 2]},
             "times of strings": {times.machine: {key: ["a", "b", "c"]}},
             "negative times": {times.machine: {key: [-1.0, -1.0, 0.0]}},
             "too few times": {times.machine: {key: [1.0]}},
             "not finite": {times.machine: {key: [float("nan"), 1.0, 0.5]}},
             "weights over backward": {times.machine: {key: [1.0, 1.0, 2.0]}}}[damage]
    kernels.cache_path().parent.mkdir(parents=True)
    kernels.cache_path().write_text(json.dumps(table))
    again = KernelTimes()
    assert again.of(the_plan, fc) == kernels.KernelTime(1e-3, 3e-3, 1e-3) and again.measured == 1
    again.save()
    assert json.loads(kernels.cache_path().read_text())[times.machine][key] == [1e-3, 3e-3, 1e-3]

def test_two_processes_timing_at_once_keep_each_others_kernels(mlp_cfg, tmp_path, monkeypatch):
    """Two `plan --cost` (or a test run beside a user's) read the cache, timed different kernels and each
    wrote the file as it had read it plus its own: the first one's kernels were lost (timed again next
    time); saving now adds to what is in the file then."""
    import json

    from singa_mpi.cost import kernels

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_measure", lambda spec, beside=None, cold=False: (1e-3, 3e-3, 1e-3))
    one, two = plan(mlp_cfg, 1), plan(mlp_cfg, 2)  # other local shapes: other kernels
    first, second = KernelTimes(), KernelTimes()
    first.of(one, one.sublayers[1])
    second.of(two, two.sublayers[1])
    first.save()
    second.save()
    saved = json.loads(kernels.cache_path().read_text())[first.machine]
    assert set(saved) == set(first.mine) | set(second.mine) and len(saved) == 2
    assert KernelTimes(recalibrate=True).mine == {}  # --recalibrate still times afresh


def test_a_cache_folder_that_cannot_be_written_is_a_warning_after_the_prediction(mlp_cfg, tmp_path, monkeypatch,
                                                                                  capsys):
    """XDG_CACHE_HOME naming a file (or a read-only folder): plan --cost printed nothing but a traceback
    (NotADirectoryError) after timing every kernel; the times are used, and a warning says they were not
    cached."""
    from singa_mpi.cost import kernels

    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))
    monkeypatch.setattr(kernels, "_measure", lambda spec, beside=None, cold=False: (1e-3, 3e-3, 1e-3))
    the_plan = plan(mlp_cfg, 1)
    times = KernelTimes()
    assert times.of(the_plan, next(s for s in the_plan.sublayers if s.params)).forward == 1e-3
    times.save()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: kernel times not cached in ")
    assert "a_file/singa_mpi/kernels.json" in lines[0] and "times them again" in lines[0]


def test_kernels_timed_beside_copies_of_themselves_are_kept_apart_and_leave_no_process(mlp_cfg, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    the_plan = plan(mlp_cfg, 2)
    fc = next(s for s in the_plan.sublayers if s.params)
    alone, beside = KernelTimes(), KernelTimes(corunners=1)
    assert alone.of(the_plan, fc).forward > 0 and beside.of(the_plan, fc).backward > 0
    # the backward's weight-gradient products, timed apart (what a runtime may queue), are part of it
    assert 0 < alone.of(the_plan, fc).weights < alone.of(the_plan, fc).backward
    assert set(alone.mine).isdisjoint(beside.mine)  # cached under their own keys
    children = [process.pid for process in beside.beside.processes]
    assert len(children) == 1 and alone.beside is None
    beside.save()
    assert beside.beside.processes == [] and not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_corunners_follow_the_cores_this_process_may_use(monkeypatch):
    from singa_mpi.cost.kernels import corunners_for

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert (corunners_for(1), corunners_for(2), corunners_for(64)) == (0, 1, 3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})  # a rank the launcher bound to one core
    assert corunners_for(8) == 0


def test_a_corunner_is_a_new_program_without_the_launchers_variables():
    """A rank that has initialised MPI starts its co-runners: they must not take themselves for ranks."""
    import subprocess
    import sys

    from singa_mpi.cost.corunners import corunner_environment

    env = corunner_environment({"PMI_RANK": "3", "PMI_SIZE": "8", "OMPI_COMM_WORLD_SIZE": "8", "HYDRA_PROXY": "x",
                                "PATH": "/bin", "OMP_NUM_THREADS": "4"}, blas_threads=1)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    loaded = subprocess.run([sys.executable, "-c", "import sys, singa_mpi.cost.corunners as c; "
                             "print(sorted(m for m in sys.modules if m.startswith('mpi4py')))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_a_corunner_that_cannot_build_its_kernel_is_a_clear_error_and_leaves_no_process(mlp_cfg):
    from singa_mpi.cost.corunners import CoRunnerError, CoRunners
    from singa_mpi.cost.kernels import kernel_spec

    the_plan = plan(mlp_cfg, 2)
    spec = kernel_spec(the_plan, next(s for s in the_plan.sublayers if s.params))
    broken = dataclasses.replace(spec, src_shapes=((7, 7, 7, 7),))  # setup refuses a 4-D input
    pool = CoRunners(1)
    with pool.alongside(spec):  # a good kernel first: the process is reused for the next
        pid = pool.processes[0].pid
    with pytest.raises(CoRunnerError, match="failed while building"):
        with pool.alongside(broken):
            pass
    assert pool.processes == [] and not _alive(pid)


def test_a_step_that_outgrows_the_cache_times_its_kernels_cold(mlp_cfg, tmp_path, monkeypatch):
    from singa_mpi.cost import kernels

    the_plan = plan(mlp_cfg, 2)  # a small MLP: its weights and activations stay cached
    assert not kernels.step_outgrows_cache(the_plan)
    monkeypatch.setattr(kernels, "last_level_cache_bytes", lambda: 1024)
    assert kernels.step_outgrows_cache(plan(mlp_cfg, 2))
    evicted = []
    seconds = kernels._timed([lambda: None, lambda: None], evict=lambda: evicted.append(1))
    assert len(seconds) == 2 and len(evicted) == kernels.COLD_RUNS  # once per run, before its first part
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    times = KernelTimes()
    fc = next(s for s in the_plan.sublayers if s.params)
    times.of(plan(mlp_cfg, 2), fc)
    assert [key for key in times.mine if key.endswith("|cold")]  # timed cold, kept apart from warm timings


def test_the_jobs_layout_and_auto_writing_it_out_share_their_kernel_timings(mlp_cfg, tmp_path):
    """plan --cost priced conf/cifar10_convnet.conf on 2 workers at 328.78 ms and plan --auto priced the
    same layout ("every layer on the batch") at 193.93 ms, both from the cache: a layer's own
    partition_dim (which --auto sets on every layer) or location was part of its kernel's key, so the same
    kernels were timed twice, under different loads."""
    the_plan = plan(mlp_cfg, 2)  # the net's partition_dim 0, inherited
    names = [layer.name for layer in mlp_cfg.proto.neuralnet.layer]
    written = plan(with_dims(mlp_cfg, dict.fromkeys(names, 0)), 2)
    placed = plan(nets.job(nets.mlp(str(tmp_path / "d.h5"), 16, "pipeline", 1)), 1)  # -1 with locations
    whole = plan(with_dims(mlp_cfg, dict.fromkeys(names, -1)), 1)
    for one, other in ((the_plan, written), (placed, whole)):
        timed = [s for s in one.sublayers if s.exchange is None and s.srcs]
        assert [signature(one, s) for s in timed] == [signature(other, s) for s in timed]
    assert signature(the_plan, the_plan.sublayers[1]) != signature(whole, whole.sublayers[1])  # other shapes


def test_different_local_shapes_have_different_signatures(mlp_cfg):
    one, two = plan(mlp_cfg, 1), plan(mlp_cfg, 2)
    fc = lambda p: next(s for s in p.sublayers if s.params)  # noqa: E731
    assert signature(one, fc(one)) != signature(two, fc(two))


def test_a_link_follows_its_measurements_where_one_line_cannot():
    # fast while in cache, half the pace beyond (as TCP measured: 3.6 GB/s at 1 MiB, 1.8 at 8 MiB)
    measured = [(8, 5e-6), (1 << 20, 5e-6 + (1 << 20) / 3.6e9), (1 << 23, 5e-6 + (1 << 23) / 1.8e9)]
    link = rate_module.fit(measured)
    for nbytes, seconds in measured:
        assert link.time(nbytes) == pytest.approx(seconds)
    middle = (1 << 20) + (1 << 22)
    assert measured[1][1] < link.time(middle) < measured[2][1]
    pace = (measured[2][1] - measured[1][1]) / (measured[2][0] - measured[1][0])
    assert link.time(1 << 25) == pytest.approx(measured[2][1] + ((1 << 25) - (1 << 23)) * pace)
    assert link.time(4) == pytest.approx(link.latency + 4 / link.bandwidth)  # below the smallest: the fit
    assert link.time(0) == 0
    noisy = rate_module.fit([(8, 1e-5), (1 << 20, 9e-6), (1 << 23, 3e-3)])
    assert noisy.time(1 << 20) == pytest.approx(1e-5)  # never faster for more bytes


def test_the_fit_recovers_latency_and_bandwidth():
    link = rate_module.fit([(n, 2e-6 + n / 5e9) for n in (8, 1 << 16, 1 << 20, 1 << 23)])
    assert link.latency == pytest.approx(2e-6, rel=1e-3)
    assert link.bandwidth == pytest.approx(5e9, rel=1e-3)


def test_auto_keeps_data_parallelism_when_exchanges_are_dear(mlp_cfg):
    choice = choose(mlp_cfg, 2, ALLREDUCE, RowKernels(), rates(p2p_bw=1e4, allreduce_bw=1e12))
    assert set(choice.dims.values()) == {0}
    assert choice.step == pytest.approx(choice.data_parallel)


def test_auto_splits_features_when_the_param_sync_is_dear(mlp_cfg):
    choice = choose(mlp_cfg, 2, ALLREDUCE, RowKernels(), rates(p2p_bw=1e12, allreduce_bw=1e5, latency=1e-9))
    assert 1 in choice.dims.values()
    assert choice.step < choice.data_parallel
    plan(with_dims(mlp_cfg, choice.dims), 2, method=ALLREDUCE)  # the choice is a plan the planner accepts


def test_auto_respects_the_memory_limit(mlp_cfg):
    unlimited = choose(mlp_cfg, 2, SHARED_MEMORY, RowKernels(), rates())
    with pytest.raises(Exception, match="fits"):
        choose(mlp_cfg, 2, SHARED_MEMORY, RowKernels(), rates(), memory_limit=16)
    assert unlimited.memory > 16


@pytest.mark.parametrize("gain,keeps_data", [(0.04, True), (0.09, True), (0.15, False)])
def test_auto_leaves_data_parallelism_only_for_a_clear_predicted_gain(mlp_cfg, monkeypatch, gain, keeps_data):
    """A plan predicted a few percent faster is within the model's error between plans (one such ran
    slower): data parallelism is kept unless the best is at least auto.MARGIN faster."""
    from types import SimpleNamespace

    from singa_mpi.cost import auto

    def fake_predict(the_plan, *args):
        fc1_on_features = any(s.origin == "fc1" and s.pdim == 1 for s in the_plan.sublayers)
        return SimpleNamespace(step=1.0 - gain if fc1_on_features else 1.0)
    monkeypatch.setattr(auto, "predict", fake_predict)
    choice = choose(mlp_cfg, 2, ALLREDUCE, RowKernels(), rates())
    assert (set(choice.dims.values()) == {0}) == keeps_data
    assert choice.data_parallel == 1.0 and choice.step == (1.0 if keeps_data else 1.0 - gain)


def test_corunners_dropped_without_close_end_with_their_input(mlp_cfg):
    import gc

    from singa_mpi.cost.corunners import CoRunners
    from singa_mpi.cost.kernels import kernel_spec

    the_plan = plan(mlp_cfg, 2)
    pool = CoRunners(1)
    with pool.alongside(kernel_spec(the_plan, next(s for s in the_plan.sublayers if s.params))):
        process = pool.processes[0]
    del pool
    gc.collect()
    assert process.wait(timeout=30) == 0


def test_an_alltoallv_takes_its_own_calibration_and_the_other_collectives_the_concats(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    the_plan = plan(nets.job(nets.mlp(data, 16, "feature", 2)), 2)
    ops = {ex.forward_op for ex in the_plan.exchanges}
    assert {"Allgatherv", "Alltoallv"} <= ops
    base = rates()
    slow_alltoall = dataclasses.replace(base, alltoall=Link(1e-5, 1e5))
    slow_concat = dataclasses.replace(base, collective=Link(1e-5, 1e5), alltoall=base.collective)
    assert slow_alltoall.exchange("Alltoallv").bandwidth == 1e5 and slow_alltoall.exchange("Allgatherv") is base.collective
    assert base.exchange("Alltoallv") is base.collective  # no Alltoallv calibration (older cache): the concat's
    fast = predict(the_plan, SHARED_MEMORY, RowKernels(), base)
    by_op = {}
    for ex in the_plan.exchanges:  # each exchange's share of the step, priced alone
        most = max(max(ex.sent_by(r), ex.received_by(r)) for r in ex.group)
        by_op[ex.forward_op] = by_op.get(ex.forward_op, 0) + (most > 0)
    assert by_op["Alltoallv"] and by_op["Allgatherv"]
    assert predict(the_plan, SHARED_MEMORY, RowKernels(), slow_alltoall).step > fast.step
    assert predict(the_plan, SHARED_MEMORY, RowKernels(), slow_concat).step > fast.step


GOOD_RATES = {"memory": 1e10, "p2p": {"latency": 1e-5, "bandwidth": 1e9}, "allreduce": {"latency": 1e-5, "bandwidth": 1e9},
              "collective": {"latency": 1e-5, "bandwidth": 1e9, "points": [[8, 1e-5], [65536, 7e-5]]},
              "when": "2026-01-01", "ranks": 2}


@pytest.mark.parametrize("damage", ["a list", "an entry of a number", "a field missing", "a negative bandwidth",
                                    "a latency of a string", "points descending", "a point of one number"])
def test_a_damaged_rates_cache_is_said_and_the_rates_assumed(tmp_path, monkeypatch, damage):
    """A rates.json of valid JSON but another shape was a traceback (AttributeError, KeyError 'latency')
    in plan --cost and --auto; the rates are now assumed, and the line naming them says why."""
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = rate_module.comm_key("mpich", 1)
    entry = json.loads(json.dumps(GOOD_RATES))
    path = rate_module.rates_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({key: entry}))
    assert rate_module.load("mpich").source.startswith("calibrated (2026-01-01, 2 ranks")
    collective = entry["collective"]
    table = {key: entry}
    if damage == "a list":
        table = [entry]
    elif damage == "an entry of a number":
        table = {key: 5}
    elif damage == "a field missing":
        del entry["memory"]
    elif damage == "a negative bandwidth":
        entry["allreduce"]["bandwidth"] = -1e9
    elif damage == "a latency of a string":
        entry["p2p"]["latency"] = "fast"
    elif damage == "points descending":
        collective["points"].reverse()
    else:
        collective["points"][1] = [65536]
    path.write_text(json.dumps(table))
    rates = rate_module.load("mpich")
    damaged = isinstance(table, dict) and isinstance(table[key], dict)
    assert rates.source == (f"the calibration in {path} is damaged, assumed rates instead" if damaged else
                            "assumed: no calibration of the communicator") + \
        " (run: mpiexec -n 2 singa-mpi calibrate)"
    assert rates.p2p.bandwidth > 0 and rates.allreduce.latency == rate_module.DEFAULT_LATENCY
    rate_module.save(GOOD_RATES, "mpich", 1)  # calibrating again mends it
    assert rate_module.load("mpich").source.startswith("calibrated")
