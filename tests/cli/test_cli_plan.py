"""`singa-mpi plan` and `check` on a machine without MPI: nothing on their path imports mpi4py."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# a Python that cannot import mpi4py: an empty module that raises on import shadows it
BLOCK = "import sys; sys.modules['mpi4py'] = None; from singa_mpi.cli import main; sys.exit(main(sys.argv[1:]))"


def run(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", BLOCK, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_plan_text_without_mpi():
    out = run("plan", "conf/cifar10_hybrid.conf")  # -n comes from cluster.nworkers_per_group: 2
    assert out.returncode == 0, out.stderr
    assert "rank 1:" in out.stdout and "concate(split(pool3))@1" in out.stdout and "Alltoallv" in out.stdout
    assert "traffic/step" in out.stdout and "total:" in out.stdout


def test_plan_of_a_cluster_names_mpiexec_the_launcher_every_mpi_has():
    """plan said "launch with mpirun -n 6" of a Downpour job; MPICH's launcher is mpiexec (Open MPI has both)."""
    out = run("plan", "conf/digits_downpour.conf")
    assert out.returncode == 0, out.stderr
    assert "(launch with mpiexec -n 6)" in out.stdout and "mpirun" not in out.stdout


def test_plan_of_a_phase_the_job_does_not_run_is_one_line():
    """digits_mlp has no validation phase: its val net reads no input layer (a traceback before); the
    check of that phase says so, as `check` does for the phases a job runs, naming the layer its
    include leaves out of the phase (it said "expected the name of a layer of phase val" of a layer
    the job has) and the two ways to give the phase its source."""
    out = run("plan", "conf/digits_mlp.conf", "-n", "2", "--phase", "val")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "singa-mpi: error: conf/digits_mlp.conf:37:5: layer 'fc1' (#2, kInnerProduct): srclayers[0] = 'data': "
        "layer 'data' is not kept for phase val (its include/exclude): expected a source kept for phase val: "
        "add kVal to its include, or give phase val a layer of its own named 'data' (include: kVal)"]
    assert run("plan", "conf/digits_mlp.conf", "-n", "2", "--phase", "test").returncode == 0


def test_plan_json_and_dot(tmp_path):
    out = run("plan", "conf/digits_mlp.conf", "-n", "3", "--format", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    records = plan["sublayers"]
    assert {"name", "type", "rank", "origin"} <= set(records[0])
    assert {r["rank"] for r in records} == {0, 1, 2}
    assert all(r["origin"] is None or r["type"].startswith("k") for r in records)
    dot = tmp_path / "plan.dot"
    out = run("plan", "conf/cifar10_hybrid.conf", "--format", "dot", "-o", str(dot))
    assert out.returncode == 0, out.stderr
    text = dot.read_text()
    assert text.startswith("digraph plan") and "cluster_rank1" in text and "fillcolor" in text


def test_plan_program_prints_each_ranks_step_in_order():
    """The hybrid convnet on 2 workers: forward, the concat's Alltoallv, backward with the exchange's
    non-blocking return trip hiding the queued gradients, then the sync and the update."""
    out = run("plan", "conf/cifar10_hybrid.conf", "--format", "program")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("programs: phase train, 2 worker(s)") and "\nrank 1:\n" in text
    rank0 = text.split("\nrank 1:")[0].splitlines()
    steps = [line.split(None, 1)[1] for line in rank0 if line.startswith("  ")]
    assert steps[0] == "zero-grads" and steps[-1].startswith(("update", "params Barrier(shm)"))
    start = next(i for i, s in enumerate(steps) if s.startswith("start backward Ialltoallv"))
    assert steps[start + 1] == "queued weight gradients" and steps[start + 2].startswith("wait Ialltoallv")
    assert steps.index("forward conv1@0") < start < steps.index("sync gradients")


def test_plan_workers_override_the_cluster():
    out = run("plan", "conf/cifar10_hybrid.conf", "-n", "3")  # the job pins 2 workers; -n overrides
    assert out.returncode == 0, out.stderr
    assert "rank 2:" in out.stdout and "rank 3:" not in out.stdout
    out = run("plan", "conf/cifar10_hybrid.conf", "--workers", "0")
    assert out.returncode == 2 and "0: expected a count of at least 1" in out.stderr


def test_check_without_mpi():
    out = run("check", "conf/mnist_conv.conf")
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


@pytest.mark.skipif(not __import__("shutil").which("dot"), reason="Graphviz is not installed")
def test_plan_png(tmp_path):
    png = tmp_path / "plan.png"
    out = run("plan", "conf/cifar10_hybrid.conf", "--format", "dot", "-o", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def run_cached(cache, *args, timeout=300):
    """`run` with the cost model's cache in ``cache`` (kernel times, calibrated rates)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", BLOCK, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_plan_cost_predicts_every_layer_and_caches_the_kernels(tmp_path):
    out = run_cached(tmp_path, "plan", "conf/cifar10_convnet.conf", "-n", "2", "--cost")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.split()}
    for layer in ("conv1", "pool1", "norm1", "conv2", "conv3", "ip1", "loss"):
        assert float(rows[layer][0]) > 0, f"{layer}: no forward time in\n{out.stdout}"
    assert float(rows["conv2"][1]) > 0
    assert "predicted step" in out.stdout and "assumed: no calibration" in out.stdout
    assert "kernel shape(s) timed now" in out.stdout
    again = run_cached(tmp_path, "plan", "conf/cifar10_convnet.conf", "-n", "2", "--cost")
    assert again.returncode == 0 and "timed now" not in again.stdout  # read back from the cache


@pytest.mark.slow
def test_plan_auto_writes_a_job_the_planner_accepts(tmp_path):
    chosen = tmp_path / "chosen.conf"
    out = run_cached(tmp_path, "plan", "conf/digits_mlp.conf", "-n", "2", "--auto", "-o", str(chosen))
    assert out.returncode == 0, out.stderr
    assert "predicted step" in out.stdout and "every layer on the batch" in out.stdout
    again = run("plan", str(chosen), "-n", "2")
    assert again.returncode == 0, again.stderr
    too_small = run_cached(tmp_path, "plan", "conf/mnist_mlp.conf", "-n", "2", "--auto", "--memory-limit", "1")
    assert too_small.returncode == 2 and too_small.stderr.count("\n") == 1
    assert "1 MiB per rank" in too_small.stderr


def test_calibrate_needs_two_ranks():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "singa_mpi", "calibrate"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "mpiexec -n 2" in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.slow
def test_plan_cost_prices_a_job_of_hundreds_of_ranks_without_launching_it(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_planner import net_text

    job = tmp_path / "wide.conf"
    job.write_text(net_text(layers=14, ranks=512, width=512))  # partition_dim 0, 1 and -1 in turn
    out = run_cached(tmp_path, "plan", str(job), "-n", "512", "--cost")
    assert out.returncode == 0, out.stderr
    assert "predicted step of 512 worker(s), batch 512" in out.stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.split()}
    for i in range(6):
        assert float(rows[f"fc{i}"][0]) > 0, out.stdout
    # the layers split 512 ways (fc0 on the batch, fc1 on features) cost far less than the whole one (fc2)
    assert float(rows["fc1"][0]) < float(rows["fc2"][0]) and float(rows["fc0"][0]) < float(rows["fc2"][0])


@pytest.mark.slow
def test_calibrate_on_two_ranks_saves_the_node_rates_that_plan_cost_then_uses(tmp_path):
    from mpi_jobs import mpi_env, mpiexec_command

    env = mpi_env(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "calibrate"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "calibrated" in out.stdout and "(one node)" in out.stdout and "point-to-point" in out.stdout
    table = json.loads((tmp_path / "singa_mpi" / "rates.json").read_text())
    (key, entry), = table.items()
    assert key.endswith("|nodes1") and entry["ranks"] == 2
    assert entry["p2p"]["bandwidth"] > 1e6 and 0 < entry["p2p"]["latency"] < 1e-2
    assert "Alltoallv" in out.stdout and entry["alltoall"]["bandwidth"] > 1e6 and len(entry["alltoall"]["points"]) >= 2
    cost = run_cached(tmp_path, "plan", "conf/digits_mlp.conf", "-n", "2", "--cost")
    assert cost.returncode == 0, cost.stderr
    assert "communicator rates: calibrated" in cost.stdout
    across = run_cached(tmp_path, "plan", "conf/digits_mlp.conf", "-n", "4", "--cost", "--nodes", "2")
    assert across.returncode == 0, across.stderr
    # no calibration between nodes on this machine: that part is assumed, and says so
    assert "between nodes (2 ranks per node) assumed" in across.stdout


@pytest.mark.parametrize("command", ["plan", "check"])
def test_plan_and_check_note_a_pipeline_on_one_worker(tmp_path, capsys, command):
    """`pipeline { micro_batches: 2 }` planned or checked for one worker: a note that it does nothing
    (plan's on stderr: its stdout is the plan, JSON here)."""
    from singa_mpi import cli

    import nets

    conf = tmp_path / "job.conf"
    data = nets.make_data(str(tmp_path / "d.h5"), 128, (12,), 5)
    conf.write_text(nets.pipelined(nets.mlp(str(data), 64, "data"), 2))
    extra = ["--format", "json"] if command == "plan" else []
    assert cli.main([command, str(conf), "-n", "1", *extra]) == 0
    out, err = capsys.readouterr()
    said = (err if command == "plan" else out).splitlines()
    notes = [line for line in said if line.startswith(f"note: {conf}:")]
    assert len(notes) == 1 and "neuralnet.pipeline has no effect on 1 worker" in notes[0], said
    if command == "plan":
        json.loads(out)


@pytest.mark.parametrize("scheme, workers, note", [
    ("data", 1, "neuralnet.pipeline has no effect on 1 worker"),
    ("data", 2, "neuralnet.pipeline's schedule has no effect: every worker starts at the net's first layer"),
    ("stages", 2, None),  # two stages: the pipeline works
    ("data", None, None)])
def test_check_without_n_notes_a_pipeline_the_job_s_own_cluster_leaves_idle(tmp_path, capsys, scheme, workers,
                                                                             note):
    """`check JOB` (no -n) made no plan, so a pipeline its own cluster.nworkers_per_group leaves idle got
    no note there, while `check -n N` and `plan` gave one; a job whose cluster fixes no worker count
    still gets none (what -n would be is unknown)."""
    from singa_mpi import cli

    import nets

    conf = tmp_path / "job.conf"
    data = nets.make_data(str(tmp_path / "d.h5"), 128, (12,), 5)
    text = nets.pipelined(nets.mlp(str(data), 64, scheme), 2)
    if workers is not None:
        assert "cluster {" not in text
        text += f"cluster {{ nworkers_per_group: {workers} }}\n"
    conf.write_text(text)
    assert cli.main(["check", str(conf)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(f"note: {conf}:") and note in notes[0], notes


@pytest.mark.parametrize("option", ["--cost", "--auto"])
def test_cost_and_auto_of_a_cd_job_name_its_train_one_batch(tmp_path, option):
    """plan --cost / --auto of an RBM (kCD) said "the cost model times the layers' forward and backward
    passes only; ..." without naming the job or the line that chose CD."""
    out = run_cached(tmp_path, "plan", "conf/rbm_digits_1.conf", "-n", "2", option)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    line, = out.stderr.splitlines()
    assert line.startswith(f"singa-mpi: error: conf/rbm_digits_1.conf:14:1: train_one_batch = kCD: plan {option}: "
                           "the cost model times the layers' forward and backward passes only; this step also makes ")
    assert line.endswith(": expected a BP or BPTT job (kBP, kBPTT)")
