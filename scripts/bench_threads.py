"""BLAS threads per rank: ms per training step of each job under each thread setting, serially and on 2 ranks.

    python scripts/bench_threads.py [--ranks 1 2] [--repeat 3] [--budget 3] [--json out.json]

Jobs (synthetic data of the right shape): digits_mlp (the default job, batch 64), mnist_mlp (batch 64)
and cifar10_convnet (batch 100); on several ranks every layer is partitioned on the batch.  Settings:

* ``env=N``: ``OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=MKL_NUM_THREADS=N`` (what a user sets; every BLAS
  library, numpy's and the one scipy bundles, gets N threads; singa_mpi changes nothing);
* ``gemm=N``: threadpoolctl, numpy's BLAS N threads, scipy's one (``singa_mpi.threads.limit_blas``);
* ``default``: nothing set, what ``singa-mpi train`` chooses (``singa_mpi.threads.blas_threads`` with
  the job's ``work_per_step``: one thread for the digits MLP, cores / ranks for the others).

Each cell is the median (first table) or the fastest (second) over ``--repeat`` runs of the median step
time (the slowest rank's); the last column is the default's time over the best setting's.  The runs
of one repeat go back to back.  On a shared machine, equal settings (``default`` and ``gemm=1`` on
2 ranks of 2 cores) differ by the noise, often 10-30%: compare the fastest runs as well.

Each run prints a line as it ends (ms/step, steps timed, seconds with start-up), each repeat the table
so far; Ctrl-C or SIGTERM prints the table of the runs done.  A run stops timing after ``--budget``
seconds of timed steps (at least 3 steps): the settings that oversubscribe the cores run 5-20x slower
and would otherwise take most of the time.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import blas_threads_as_train, report_if_cut_short  # noqa: E402 - scripts/ is on the path from here on
from singa_mpi.communication.launchers import find_launcher  # noqa: E402

JOBS = {"digits_mlp": ((64,), 1437, 200), "mnist_mlp": ((784,), 2048, 20), "cifar10_convnet": ((3, 32, 32), 1000, 8)}
SETTINGS = ["env=1", "env=2", "gemm=1", "gemm=2", "default"]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Timed steps per run stop after BUDGET seconds (at least MIN_STEPS): a setting that oversubscribes the cores
# (2 ranks x 2 threads in numpy's and scipy's OpenBLAS on 2 cores) runs its steps 5-20x slower, and those
# few runs took most of the time of a --repeat 5 (past 10 minutes); a few steps show the slowdown as well.
BUDGET, MIN_STEPS = 3.0, 3
LEGEND = ("env=N: OMP/OPENBLAS/MKL_NUM_THREADS=N; gemm=N: numpy's BLAS N threads, scipy's 1; "
          "default: no variables set (singa_mpi's choice)")


def worker(args) -> int:
    """One job and setting in this process (under mpiexec when ``--ranks`` > 1); prints JSON on rank 0."""
    from threadpoolctl import threadpool_info

    from singa_mpi import threads
    from singa_mpi.checks.job import validate

    def setting(trainer):
        """What the setting changes; ``default``: what the launcher does for `singa-mpi train`."""
        if args.setting.startswith("gemm="):
            return threads.limit_blas(int(args.setting[5:]))
        work = threads.work_per_step(trainer.cfg, validate(trainer.cfg), trainer.runtime.size)
        return threads.blas_threads(work=work)

    step_ms, steps, world, blas = _time_steps(args.job, args.steps, args.budget, setting, threadpool_info)
    if world is None or world.rank == 0:
        print(json.dumps({"job": args.job, "setting": args.setting, "ranks": 1 if world is None else world.size,
                          "step_ms": step_ms, "steps": steps, "blas_threads": blas}))
    return 0


def _time_steps(job: str, steps: int, budget: float, setting, threadpool_info):
    """(median ms per step of the slowest rank, steps timed, the MPI world or None, {BLAS library: threads})
    of ``job`` on synthetic data, timed inside ``setting(trainer)``: ``steps`` steps, fewer (at least
    MIN_STEPS) once the timed ones took ``budget`` seconds on some rank."""
    from bench_scaling import partitioned
    from bench_serial import job_on_synthetic_data

    from singa_mpi.trainer import Trainer
    shape, count, _ = JOBS[job]
    world = None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        from singa_mpi.communication import mpi as comm_module
        world = comm_module.world()
    folder = tempfile.mkdtemp(prefix=f"bench_threads_r{0 if world is None else world.rank}_")
    cfg = job_on_synthetic_data(f"{job}.conf", folder, shape, count)
    if world is None:
        from singa_mpi.runtimes.serial import SerialRuntime
        runtime = SerialRuntime(cfg, 1, folder)
    else:
        from singa_mpi.runtimes.worker import WorkerRuntime
        runtime = WorkerRuntime(partitioned(cfg, "data"), 1, folder, world)
    trainer = Trainer(cfg, folder, runtime, log=lambda line: None)
    times = []
    with setting(trainer):
        blas = {pathlib.Path(i["filepath"]).name: i["num_threads"] for i in threadpool_info()}
        for step in range(3):
            trainer.train_one_batch(step)
        for step in range(steps):
            spent = len(times) >= MIN_STEPS and sum(times) > budget
            if world is not None:
                spent = any(world.allgather_object(spent))  # every rank stops after the same step
                world.barrier()
            if spent:
                break
            start = time.perf_counter()
            trainer.train_one_batch(3 + step)
            times.append(time.perf_counter() - start)
    step_ms = 1e3 * statistics.median(times)
    if world is not None:
        step_ms = max(world.allgather_object(step_ms))
        runtime.close()
    shutil.rmtree(folder, ignore_errors=True)
    return step_ms, len(times), world, blas


def launch(job: str, setting: str, ranks: int, steps: int, budget: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if setting.startswith("env="):
        env.update({name: setting[4:] for name in THREAD_VARIABLES})
    env = find_launcher().environ(env)  # what the launcher's MPI needs (SINGA_MPI_FLAVOR=openmpi|mpich)
    cmd = [sys.executable, __file__, "--worker", "--job", job, "--setting", setting, "--steps", str(steps),
           "--budget", str(budget)]
    if ranks > 1:
        cmd = find_launcher().command(ranks) + cmd
    began = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{job} {setting} on {ranks} rank(s) failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), wall_s=time.perf_counter() - began)


def print_table(runs: list[dict], settings: list[str], stat=statistics.median) -> None:
    """One row per job and rank count: ``stat`` (median or min) over the runs of each setting."""
    cells: dict[tuple, list[float]] = {}
    for r in runs:
        cells.setdefault((r["job"], r["ranks"], r["setting"]), []).append(r["step_ms"])
    rows = sorted({(job, ranks) for job, ranks, _ in cells}, key=lambda k: (list(JOBS).index(k[0]), k[1]))
    what = "median" if stat is statistics.median else "fastest"
    print(f"ms/step, {what} of {max(len(v) for v in cells.values())} runs ({os.cpu_count()} cores)")
    print(f"{'job':<17}{'ranks':>5}" + "".join(f"{s:>10}" for s in settings) + f"{'default/best':>14}")
    for job, ranks in rows:
        values = {s: stat(cells[(job, ranks, s)]) for s in settings if (job, ranks, s) in cells}
        ratio = values["default"] / min(values.values()) if "default" in values else float("nan")
        print(f"{job:<17}{ranks:>5}" + "".join(f"{values.get(s, float('nan')):>10.2f}" for s in settings)
              + f"{ratio:>14.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--settings", nargs="+", default=SETTINGS)
    parser.add_argument("--json", help="also write every run here")
    parser.add_argument("--worker", action="store_true", help="time one --job/--setting in this process")
    parser.add_argument("--job", choices=list(JOBS))
    parser.add_argument("--setting")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--budget", type=float, default=BUDGET,
                        help=f"seconds of timed steps per run, after at least {MIN_STEPS} (default {BUDGET:g})")
    args = parser.parse_args()
    if args.worker:  # sets its own threads: the setting it measures
        return worker(args)
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    runs: list[dict] = []

    def report() -> None:
        if not runs:
            print("no run finished yet")
            return
        print(LEGEND)
        print_table(runs, args.settings)
        print_table(runs, args.settings, min)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")

    began = time.perf_counter()
    with report_if_cut_short(report):
        for repeat in range(args.repeat):
            for job in args.jobs:
                for ranks in args.ranks:
                    for setting in args.settings:
                        runs.append(launch(job, setting, ranks, JOBS[job][2], args.budget))
                        r = runs[-1]
                        print(f"  {job} n={ranks} {setting}: {r['step_ms']:.2f} ms/step ({r['steps']} steps, "
                              f"{r['wall_s']:.0f}s) [{repeat + 1}/{args.repeat}]", flush=True)
            if repeat + 1 < args.repeat:
                print(f"after {repeat + 1} of {args.repeat} repeats:")
                print_table(runs, args.settings)
    report()
    print(f"total time {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
