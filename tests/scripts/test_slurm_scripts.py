"""The Slurm scripts (slurm/) run under stand-ins for sbatch and scontrol (tests/scripts/fake_slurm: the
job runs at once, here) with fake SLURM_* variables: no Slurm needed, seconds each."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE_SLURM = pathlib.Path(__file__).resolve().parent / "fake_slurm"


def slurm_env(tmp_path: pathlib.Path, **more: str) -> dict:
    """This Python and the stand-ins first on PATH; the stand-ins' calls logged to tmp_path/slurm.log."""
    path = os.pathsep.join([str(FAKE_SLURM), os.path.dirname(sys.executable), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "SINGA_PYTHON": sys.executable, "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"),
            **more}


def old_campaign(results: pathlib.Path) -> None:
    """Results an earlier campaign left in RESULTS (as campaigns did before they had their own folder)."""
    results.mkdir(parents=True, exist_ok=True)
    for ranks, sps in ((1, 1000.0), (2, 1600.0)):
        (results / f"bench-mnist_mlp-data-n{ranks}.json").write_text(json.dumps(
            {"net": "mnist_mlp", "scheme": "data", "ranks": ranks, "batch": 64, "samples_per_s": sps,
             "step_ms": 64e3 / sps, "exposed_comm_share": 0.0, "bytes_per_step": 0.0, "cores": 16}) + "\n")


def test_a_campaign_whose_tasks_all_fail_names_them_and_fails(tmp_path):
    """Every task fails (an unknown launcher): no earlier campaign's table, each task named, exit 1."""
    results = tmp_path / "results"
    old_campaign(results)
    env = slurm_env(tmp_path, RESULTS=str(results), SINGA_LAUNCHER="bogus")
    out = subprocess.run(["bash", str(ROOT / "slurm" / "bench_campaign.sh"), "--wait"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "samples/s" not in out.stdout, out.stdout  # not the earlier campaign's table
    [campaign] = [p for p in results.iterdir() if p.is_dir()]
    assert campaign.name.startswith("campaign-")
    tasks = [f"{net} {scheme} n={n}" for n in (1, 2) for net in ("mnist_mlp", "cifar10_convnet")
             for scheme in ("data", "feature", "hybrid")]
    assert f"{campaign}: no result from 12 task(s): {', '.join(tasks)}: expected" in out.stdout, out.stdout
    assert (campaign / "scaling.txt").read_text() in out.stdout
    task_outputs = list(campaign.glob("slurm-*.out"))
    assert len(task_outputs) == 12 and "expected srun or mpiexec" in task_outputs[0].read_text()


def test_the_collecting_job_takes_paths_with_spaces(tmp_path):
    """RESULTS and SINGA_PYTHON with a space: the collecting job's --wrap line keeps each one word."""
    folder = tmp_path / "dir with space"
    folder.mkdir()
    python = folder / "my python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    results = folder / "my results"
    env = slurm_env(tmp_path, RESULTS=str(results), SINGA_LAUNCHER="bogus", SINGA_PYTHON=str(python))
    out = subprocess.run(["bash", str(ROOT / "slurm" / "bench_campaign.sh"), "--wait", "4"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    [campaign] = list(results.iterdir())
    assert f"{campaign}: no result from 12 task(s): mnist_mlp data n=1, " in out.stdout, out.stdout
    assert "cifar10_convnet hybrid n=4: expected" in out.stdout, out.stdout


def train_sbatch(tmp_path: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """slurm/train.sbatch as Slurm runs it (job 4242, 1 task), its workspace tmp_path/ws."""
    knobs = ("SINGA_ELASTIC", "SINGA_LAUNCHER", "SLURM_")  # none from the environment the tests run in
    environ = {key: value for key, value in slurm_env(tmp_path).items() if not key.startswith(knobs)}
    environ.update(SLURM_JOB_ID="4242", SLURM_NTASKS="1", SINGA_WORKSPACE=str(tmp_path / "ws"), **env)
    return subprocess.run(["bash", str(ROOT / "slurm" / "train.sbatch"), str(ROOT / "conf" / "digits_mlp.conf"),
                           *args], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)


def requeued(tmp_path: pathlib.Path) -> bool:
    log = tmp_path / "slurm.log"
    return log.exists() and "scontrol requeue 4242" in log.read_text()


def stale_summary(workspace: pathlib.Path) -> None:
    """What the supervisor of an earlier allocation of the job left: it gave up for want of ranks."""
    (workspace / "supervisor").mkdir(parents=True)
    summary = workspace / "supervisor" / "summary.json"
    summary.write_text('{"too_few_ranks": true}\n')
    os.utime(summary, (1.7e9, 1.7e9))


def test_a_supervisor_that_fails_early_is_not_requeued_on_an_earlier_summary(tmp_path):
    """The supervisor refuses its options before it writes a summary: the job fails, not requeued."""
    stale_summary(tmp_path / "ws")
    out = train_sbatch(tmp_path, SINGA_ELASTIC="1", SINGA_ELASTIC_OPTIONS="--min-ranks two")
    assert out.returncode == 2, out.stdout + out.stderr
    assert not requeued(tmp_path)
    assert not list((tmp_path / "ws").glob(".launched-*"))  # the mark is removed


def test_a_supervisor_that_gives_up_for_want_of_ranks_requeues_the_job(tmp_path):
    """This launch's summary says too few ranks: the job is requeued (exit 0)."""
    stale_summary(tmp_path / "ws")
    python = tmp_path / "python"  # the supervisor gives up at once; anything else is this Python
    python.write_text(f"""#!/bin/sh
if [ "$1 $2 $3" = "-m singa_mpi run" ]; then
  echo '{{"too_few_ranks": true}}' > "{tmp_path}/ws/supervisor/summary.json"
  echo "singa-mpi run: gave up: 1 rank would be left, fewer than --min-ranks 2" >&2
  exit 1
fi
exec "{sys.executable}" "$@"
""")
    python.chmod(0o755)
    out = train_sbatch(tmp_path, SINGA_ELASTIC="1", SINGA_ELASTIC_OPTIONS="--min-ranks 2", SINGA_PYTHON=str(python))
    assert out.returncode == 0, out.stdout + out.stderr
    assert requeued(tmp_path)


def test_singa_elastic_0_trains_without_the_supervisor(tmp_path):
    """SINGA_ELASTIC=0 means no supervisor: the ranks train under mpiexec, and a failed run (a bad option)
    with a stale summary saying too few ranks is not requeued as the supervisor's give-up would be."""
    stale_summary(tmp_path / "ws")
    python = tmp_path / "python"  # this Python, noting how it is called
    python.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/calls"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = train_sbatch(tmp_path, "--steps", "x", SINGA_ELASTIC="0", SINGA_PYTHON=str(python))
    assert out.returncode != 0 and not requeued(tmp_path), out.stdout + out.stderr
    calls = (tmp_path / "calls").read_text()
    assert "-m singa_mpi train " in calls and "-m singa_mpi run " not in calls, calls


def test_singa_elastic_other_values_are_refused_in_one_line(tmp_path):
    out = train_sbatch(tmp_path, SINGA_ELASTIC="on")
    assert out.returncode == 2
    assert out.stderr.strip() == ("singa-mpi: SINGA_ELASTIC=on: expected 1 (train under the supervisor) or 0 "
                                  "(true/false, yes/no)")
    assert not (tmp_path / "ws").exists()


def test_a_failed_run_s_error_reaches_slurm_s_output_and_the_log(tmp_path):
    out = train_sbatch(tmp_path, "--steps", "x")
    assert out.returncode == 2, out.stdout + out.stderr
    log = tmp_path / "ws" / "slurm-4242.log"
    error = "singa-mpi train: error: argument --steps: 'x': expected an integer"
    assert error in out.stdout and error in log.read_text(), out.stdout
    assert out.stdout.splitlines()[-1] == f"singa-mpi: training finished with exit code 2 (the ranks' output, the error above: {log})"


@pytest.mark.slow
def test_scancel_s_sigterm_to_every_process_still_checkpoints_and_requeues(tmp_path):
    """scancel signals every process of the job, the tee of the output included: the ranks still
    checkpoint (the launcher gets SIGUSR1), the job is requeued, and the last lines reach both outputs."""
    knobs = ("SINGA_ELASTIC", "SINGA_LAUNCHER", "SLURM_")
    environ = {key: value for key, value in slurm_env(tmp_path).items() if not key.startswith(knobs)}
    environ.update(SLURM_JOB_ID="4243", SLURM_NTASKS="2", SINGA_WORKSPACE=str(tmp_path / "ws"))
    job = subprocess.Popen(["bash", str(ROOT / "slurm" / "train.sbatch"), str(ROOT / "conf" / "digits_mlp.conf"),
                            "--steps", "1000000"], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = tmp_path / "ws" / "slurm-4243.log"
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and "step     100/" in log.read_text()) and time.monotonic() < deadline:
            assert job.poll() is None, job.stdout.read()
            time.sleep(0.5)
        os.killpg(job.pid, signal.SIGTERM)  # the job's own session: this test's processes only
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, output
    assert "scontrol requeue 4243" in (tmp_path / "slurm.log").read_text()
    last = "singa-mpi: checkpointed before the time limit; requeueing job 4243"
    assert output.strip().splitlines()[-1] == last and log.read_text().strip().splitlines()[-1] == last
    assert (tmp_path / "ws" / "checkpoint").is_dir()
